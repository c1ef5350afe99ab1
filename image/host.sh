#!/usr/bin/env bash
# Make this (Debian) machine able to build and run the image without a Docker engine: podman with runc (crun
# fails on a hybrid cgroup layout), no default ulimits (the container may not raise them here), mmdebstrap for
# the local base (image/base.sh). Idempotent, and a no-op in well under a second once done. Needs root.
set -euo pipefail

packages=(podman runc mmdebstrap)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "image/host.sh: installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# A drop-in, so a containers.conf the machine already has is left as it is.
conf=/etc/containers/containers.conf.d/50-reservoir.conf
if [[ ! -f $conf ]]; then
  mkdir -p "$(dirname "$conf")"
  cat >"$conf" <<'CONF'
# written by reservoir's image/host.sh
[containers]
default_ulimits = []

[engine]
runtime = "runc"
CONF
  echo "image/host.sh: wrote $conf"
fi
