#!/usr/bin/env bash
# Builds the image and runs it as a user would (`make docker-check`):
#   /healthz and the HEALTHCHECK, the non-root uid, the Host check, a chat
#   request forwarded to a scripted upstream (docker/check_upstream.py, in a
#   second container on a network of its own), a compaction's checkpoint
#   surviving the container's re-creation on a volume, and `docker stop`
#   letting a 12 s request finish.
# Uses the engine if one answers; otherwise says why and exits 0, "skipped".
# The base is $BASE_IMAGE (default python:3.12-slim) if present or pullable,
# else a local Debian one (docker/make-base.sh; needs root and debootstrap).
# Needs curl and python3 on the host. Leaves the images, removes the rest.
# With docker compose (or docker-compose), also checks the compose files parse.
set -euo pipefail
cd "$(dirname "$0")/.."

image=${IMAGE:-compaction-proxy:check}
base=${BASE_IMAGE:-python:3.12-slim}
local_base=compaction-proxy-base:bookworm
run=cpcheck-$$
slow_seconds=12

say() { printf 'docker-check: %s\n' "$*"; }
skip() {
    say "skipped: $*"
    exit 0
}
fail() {
    say "FAILED: $*" >&2
    for name in "$run-proxy" "$run-upstream"; do
        docker logs --tail 20 "$name" 2>&1 | sed "s/^/  [$name] /" >&2 || true
    done
    exit 1
}
now() { date +%s.%N; }
since() { python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$1" "$(now)"; }

# --- an engine and a base image ------------------------------------------------
command -v docker >/dev/null 2>&1 || skip "no docker command on this machine."
if ! info=$(docker info 2>&1 >/dev/null); then
    skip "no Docker engine answers ($(printf '%s' "$info" | grep -m1 -iE 'cannot|error|denied' || true))." \
        "Start one (Debian: apt-get install docker.io; dockerd &) and run again."
fi
for tool in curl python3; do
    command -v "$tool" >/dev/null 2>&1 || fail "$tool is needed on the host."
done

if docker image inspect "$base" >/dev/null 2>&1; then
    say "base image $base (present)"
elif docker pull -q "$base" >/dev/null 2>&1; then
    say "base image $base (pulled)"
elif docker image inspect "$local_base" >/dev/null 2>&1; then
    say "base image $local_base (local stand-in for $base, which cannot be pulled)"
    base=$local_base
else
    say "$base cannot be pulled; making a local Debian base with docker/make-base.sh"
    docker/make-base.sh "$local_base" >/dev/null || skip "no base image: $base cannot be pulled" \
        "and docker/make-base.sh could not make one (see above)."
    base=$local_base
fi

cleanup() {
    docker rm -f -v "$run-proxy" "$run-upstream" >/dev/null 2>&1 || true
    docker network rm "$run" >/dev/null 2>&1 || true
    docker volume rm "$run-state" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# --- build ---------------------------------------------------------------------
started=$(now)
build_log=$(mktemp)
docker build -f docker/Dockerfile --build-arg BASE_IMAGE="$base" -t "$image" . >"$build_log" 2>&1 \
    || fail "docker build failed: $(tail -20 "$build_log")"
rm -f "$build_log"
size=$(docker image inspect -f '{{.Size}}' "$image")
base_size=$(docker image inspect -f '{{.Size}}' "$base")
say "built $image in $(since "$started") s: $((size / 1000000)) MB, base + $(((size - base_size) / 1000000)) MB"

# --- start: a scripted upstream and the proxy -----------------------------------
docker network create "$run" >/dev/null
docker run -d --name "$run-upstream" --network "$run" --network-alias upstream \
    -e SLOW_SECONDS="$slow_seconds" -v "$PWD/docker/check_upstream.py:/check_upstream.py:ro" \
    --entrypoint python3 "$image" /check_upstream.py >/dev/null

start_proxy() {
    # As docs/operations.md runs it: read-only, the state volume, a stop timeout above
    # the drain. The small window for "tiny" makes a short conversation compact.
    docker run -d --name "$run-proxy" --network "$run" -p 127.0.0.1::8808 \
        --read-only --tmpfs /tmp -v "$run-state:/var/lib/compaction-proxy" --stop-timeout 40 \
        -e COMPACTION_PROXY_UPSTREAM__BASE_URL=http://upstream:9000/v1 \
        -e COMPACTION_PROXY_COMPACTION__SUMMARIZER=extractive \
        -e 'COMPACTION_PROXY_MODELS={"tiny": {"context_window": 2048, "reserve_tokens": 256}}' \
        "$image" >/dev/null
    port=$(docker port "$run-proxy" 8808/tcp | head -1 | sed 's/.*://')
    base_url="http://127.0.0.1:$port"
    local started i
    started=$(now)
    for i in $(seq 100); do
        curl -fsS "$base_url/healthz" >/dev/null 2>&1 && break
        [ "$i" = 100 ] && fail "/healthz did not answer within 20 s"
        sleep 0.2
    done
    say "/healthz answered $(curl -fsS "$base_url/healthz") $(since "$started") s after docker run"
}
start_proxy

started=$(now)
for i in $(seq 60); do
    health=$(docker inspect -f '{{.State.Health.Status}}' "$run-proxy")
    [ "$health" = healthy ] && break
    [ "$i" = 60 ] && fail "HEALTHCHECK still says $health after 30 s"
    sleep 0.5
done
say "HEALTHCHECK: healthy $(since "$started") s later"

# --- non-root ------------------------------------------------------------------
uid=$(docker exec "$run-proxy" awk '/^Uid:/ {print $2}' /proc/1/status)
user=$(docker exec "$run-proxy" id -un)
[ "$uid" = 10001 ] && [ "$user" = compaction-proxy ] || fail "PID 1 runs as uid $uid ($user)"
say "PID 1 runs as uid $uid ($user)"

# --- the Host check --------------------------------------------------------------
status=$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: evil.example.com' "$base_url/healthz")
[ "$status" = 403 ] || fail "a DNS-rebinding Host got $status, not 403"
say "Host: evil.example.com gets 403 on the published port"

# --- a forwarded chat request ------------------------------------------------------
chat() { # chat BODY [curl options…]: prints headers and body
    local body=$1
    shift
    curl -sS -D - -H 'content-type: application/json' -H 'authorization: Bearer sk-check' \
        --data-binary "$body" "$@" "$base_url/v1/chat/completions"
}
reply=$(chat '{"model": "gpt-4o", "messages": [{"role": "user", "content": "ping"}]}')
grep -q 'pong from the check upstream (1 messages)' <<<"$reply" \
    || fail "the chat request was not answered by the upstream: $reply"
say "chat request forwarded: $(grep -o 'pong from the check upstream ([0-9]* messages)' <<<"$reply")"

# --- state on the volume survives re-creating the container ---------------------
long=$(python3 -c '
import json
words = " ".join(f"word{i}" for i in range(120))
messages = [{"role": "system", "content": "You are terse."}]
for turn in range(30):
    messages.append({"role": "user", "content": f"question {turn}: {words}"})
    messages.append({"role": "assistant", "content": f"answer {turn}: {words}"})
messages.append({"role": "user", "content": "and now?"})
print(json.dumps({"model": "tiny", "messages": messages}))')
reply=$(chat "$long")
checkpoint=$(grep -i '^x-compaction-id:' <<<"$reply" | tr -d '\r' | awk '{print $2}')
[ -n "$checkpoint" ] || fail "the long conversation was not compacted: $(head -c 600 <<<"$reply")"
say "a 61-message conversation was compacted: $(grep -o '([0-9]* messages)' <<<"$reply" | tr -d '()') reached the upstream, checkpoint $checkpoint"
docker rm -f "$run-proxy" >/dev/null
start_proxy
status=$(curl -s -o /dev/null -w '%{http_code}' -H 'authorization: Bearer sk-check' \
    "$base_url/v1/compaction/checkpoints/$checkpoint")
[ "$status" = 200 ] || fail "checkpoint $checkpoint got $status after re-creating the container"
say "after docker rm and a new docker run on the same volume, the checkpoint is still there (200)"

# --- docker stop lets a request in flight finish ----------------------------------
out=$(mktemp)
chat '{"model": "slow", "messages": [{"role": "user", "content": "take your time"}]}' \
    -o "$out" -w '%{http_code}' >"$out.status" 2>&1 &
client=$!
for i in $(seq 100); do
    docker logs "$run-upstream" 2>/dev/null | grep -q 'slow request received' && break
    [ "$i" = 100 ] && fail "the slow request never reached the upstream"
    sleep 0.1
done
started=$(now)
docker stop "$run-proxy" >/dev/null # the container's own --stop-timeout (40 s)
stopped=$(since "$started")
wait "$client" || true
exit_code=$(docker inspect -f '{{.State.ExitCode}}' "$run-proxy")
status=$(tail -c 3 "$out.status")
grep -q 'pong from the check upstream' "$out" || status="$status without the answer"
rm -f "$out" "$out.status"
[ "$status" = 200 ] && [ "$exit_code" = 0 ] \
    || fail "docker stop with a ${slow_seconds} s request in flight: client got $status, exit code $exit_code"
say "docker stop with a ${slow_seconds} s request in flight: the client got its 200 answer," \
    "the proxy exited 0 after $stopped s (Docker's default would have killed it at 10 s)"

# --- the compose files parse ------------------------------------------------------
if docker compose version >/dev/null 2>&1; then
    compose=(docker compose)
elif command -v docker-compose >/dev/null 2>&1; then
    compose=(docker-compose)
else
    compose=()
fi
if [ ${#compose[@]} -gt 0 ]; then
    for file in docker/compose.yaml docker/compose.replicas.yaml; do
        "${compose[@]}" -f "$file" config -q || fail "$file: ${compose[*]} config refuses it"
    done
    say "compose files accepted by ${compose[*]} ($("${compose[@]}" version --short 2>/dev/null || true))"
fi

say "passed"
