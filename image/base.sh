#!/usr/bin/env bash
# A Python 3.11 base image made locally from Debian bookworm packages (its python3 is 3.11), for a machine that
# cannot pull the official python:3.11-slim: `make image BASE=localhost/reservoir-base`. Built once (about 25 s),
# then reused; `--force` builds it again. Needs root, podman and mmdebstrap (image/host.sh).
#
# The machine's own extra CAs (/usr/local/share/ca-certificates, e.g. an egress proxy's) are trusted inside it, and
# pip is pointed at the system bundle, so `pip install` in the image build reaches PyPI from where the host does.
set -euo pipefail

name=${RESERVOIR_BASE:-localhost/reservoir-base}
if [[ ${1:-} != --force ]] && podman image exists "$name"; then
  exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
started=$SECONDS
mmdebstrap --quiet --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates \
  --customize-hook='copy-in /usr/local/share/ca-certificates /usr/local/share' \
  --customize-hook='chroot "$1" update-ca-certificates >/dev/null' \
  --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
  bookworm "$work/rootfs.tar"
podman import --quiet \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'ENV LANG=C.UTF-8' \
  --change 'ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt' \
  --change 'CMD ["python3"]' \
  "$work/rootfs.tar" "$name" >/dev/null
echo "image/base.sh: built $name in $((SECONDS - started))s"
