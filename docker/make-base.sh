#!/usr/bin/env bash
# Makes a local Debian base image standing in for python:3.12-slim, for a
# machine whose engine cannot pull from a registry of images:
#   docker/make-base.sh [TAG]        (default compaction-proxy-base:bookworm)
# Needs root, debootstrap and a Debian package mirror. The result is Debian
# bookworm (minbase) with python3 (3.11) and python3-venv: what the
# Dockerfile asks of its BASE_IMAGE. Certificate authorities added to this
# machine (/usr/local/share/ca-certificates, e.g. a TLS-inspecting proxy's)
# are trusted inside it too, so pip can reach the package index during the
# build as it does here.
set -euo pipefail

tag=${1:-compaction-proxy-base:bookworm}
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}

if ! command -v debootstrap >/dev/null 2>&1; then
    echo "make-base: debootstrap is not installed (apt-get install debootstrap)" >&2
    exit 1
fi
if [ "$(id -u)" != 0 ]; then
    echo "make-base: debootstrap needs root" >&2
    exit 1
fi

root=$(mktemp -d /tmp/compaction-proxy-base.XXXXXX)
chmod 0755 "$root" # it becomes the image's /, which every user must enter
trap 'rm -rf "$root"' EXIT

debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$mirror" >"$root.log" 2>&1 || {
    tail -20 "$root.log" >&2
    rm -f "$root.log"
    exit 1
}
rm -f "$root.log"

if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/"
    chroot "$root" update-ca-certificates >/dev/null 2>&1
fi
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*

tar -C "$root" -c . | docker import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["python3"]' \
    - "$tag" >/dev/null
echo "$tag"
