from __future__ import annotations

import pytest

from compaction.text.shell import ShellFiles, looks_like_path, shell_files


@pytest.mark.parametrize(
    ("command", "read", "modified"),
    [
        ("cat tests/missing_colon.py", ["tests/missing_colon.py"], []),
        ("head -n 20 setup.py && tail -5 src/a.py", ["setup.py", "src/a.py"], []),
        ("nl -ba django/db/loader.py | sed -n '80,100p'", ["django/db/loader.py"], []),
        ("sed -n 1,10p a.py b.py", ["a.py", "b.py"], []),
        ('grep -C 5 "__file__" django/db/loader.py', ["django/db/loader.py"], []),
        ("grep -e foo.py -n src/x.py", ["src/x.py"], []),
        ("grep -rn foo django/db", [], []),
        ("wc -l z.py # count > y.py", ["z.py"], []),
        ("sed -i 's/a: float/b: float/' tests/missing_colon.py", [], ["tests/missing_colon.py"]),
        ("sed -i.bak -e 's/x/y/' a/b.cfg", [], ["a/b.cfg"]),
        ("perl -pi -e 's/a/b/' lib/x.pm", [], ["lib/x.pm"]),
        ("echo hi > notes.md; echo more >> log/out.txt", [], ["notes.md", "log/out.txt"]),
        ("python x.py 2>/dev/null > out.log 2>&1", [], ["out.log"]),
        ("cat > src/app.py << 'EOF'\nx = 1 > 2\nprint('a.py')\nEOF", [], ["src/app.py"]),
        (
            "cat <<EOF > reproduce_app/apps.py\nfrom x import y\nEOF\ncat a.txt",
            ["a.txt"],
            ["reproduce_app/apps.py"],
        ),
        ("echo x | tee -a out/one.txt two.md", [], ["out/one.txt", "two.md"]),
        ("mkdir -p pkg/sub\ntouch pkg/sub/__init__.py", [], ["pkg/sub/__init__.py"]),
        ("cp a/b.py c/d.py; mv e.py f.py", ["a/b.py"], ["c/d.py", "e.py", "f.py"]),
        ("rm -rf build/ tmp/x.log", [], ["tmp/x.log"]),
        ("git checkout -- src/a.py && git diff", [], ["src/a.py"]),
        ("git apply <<'EOF'\n--- a/src/x.py\n+++ b/src/x.py\n@@ -1 +1 @@\nEOF", [], ["src/x.py"]),
        ("patch -p1 <<EOF\n+++ b/lib/y.c\nEOF", [], ["lib/y.c"]),
        ("python3 - <<'EOF'\nwith open('a/b.py', 'w') as f:\n  f.write('')\nEOF", [], ["a/b.py"]),
        ("python -c \"open('x.txt','w').write('1')\"", [], ["x.txt"]),
        ("cat <<EOF > gen.py\nopen('not/run.py', 'w')\nEOF", [], ["gen.py"]),
        ("cd /testbed && ls -la && python -m pytest tests/", [], []),
        ("echo MINI_SWE_AGENT_FINAL_OUTPUT && git add -A && git diff --cached", [], []),
        ("find . -name '*.py' | xargs grep foo", [], []),
    ],
)
def test_shell_files(command: str, read: list[str], modified: list[str]) -> None:
    assert shell_files(command) == ShellFiles(tuple(read), tuple(modified))


def test_shell_unbalanced_quotes_do_not_raise() -> None:
    assert shell_files("echo 'oops > x.py") == ShellFiles((), ("x.py",))


def test_shell_read_then_modified_is_only_modified() -> None:
    assert shell_files("cat a.py && sed -i s/x/y/ a.py") == ShellFiles((), ("a.py",))


@pytest.mark.parametrize(
    ("token", "expected"),
    [
        ("src/app.py", True),
        ("setup.cfg", True),
        ("Makefile", False),
        ("src/Makefile", True),
        ("build/", False),
        ("/dev/null", False),
        ("$HOME/x.py", False),
        ("*.py", False),
        ("https://example.com/a.py", False),
        ("-n", False),
        ("3.14", False),
        ("a=b.py", False),
        ("", False),
    ],
)
def test_looks_like_path(token: str, expected: bool) -> None:
    assert looks_like_path(token) is expected
