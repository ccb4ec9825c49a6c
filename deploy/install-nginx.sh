#!/usr/bin/env bash
# Puts an nginx binary at DEST/usr/sbin/nginx (default .venv/opt/nginx) for `make cluster`
# and its test, without installing anything system-wide: Debian's nginx package is
# downloaded with `apt-get download` and unpacked with `dpkg -x`. Its shared libraries
# (libc, libcrypt, libpcre2, libssl, zlib) are part of every Debian base system.
# Idempotent; does nothing if DEST already holds nginx or an nginx is on PATH (the cluster
# takes that one). Off Debian and Ubuntu, without apt, it says so in one line and fails.
set -euo pipefail

dest=$(realpath -m "${1:-.venv/opt/nginx}")
if [[ -x "$dest/usr/sbin/nginx" ]] || command -v nginx >/dev/null || [[ -x /usr/sbin/nginx ]]; then
    exit 0
fi
if ! command -v apt-get >/dev/null || ! command -v dpkg >/dev/null; then
    echo "install-nginx: no apt-get/dpkg here (not Debian or Ubuntu): install nginx with your package manager, then rerun" >&2
    exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
chmod 755 "$work"  # apt's download sandbox user must be able to write here
cd "$work"

fetch() {
    # bookworm and later ship the binary in "nginx"; older releases in "nginx-core".
    apt-get download -q nginx 2>/dev/null || apt-get download -q nginx-core 2>/dev/null
}

if ! fetch; then
    # A fresh machine may have no package lists yet; refreshing them needs root.
    if [[ $(id -u) -ne 0 ]]; then
        echo "install-nginx: apt-get download nginx failed; run 'sudo apt-get update' or install nginx" >&2
        exit 1
    fi
    apt-get update -qq
    fetch
fi

dpkg -x ./*.deb root
if [[ ! -x root/usr/sbin/nginx ]]; then
    echo "install-nginx: the downloaded package holds no usr/sbin/nginx" >&2
    exit 1
fi
mkdir -p "$dest/usr/sbin"
cp root/usr/sbin/nginx "$dest/usr/sbin/nginx"
"$dest/usr/sbin/nginx" -v
