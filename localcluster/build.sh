#!/usr/bin/env bash
# Builds the local control plane (etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl,
# kwok), helm (for the chart's tests), promtool (for the alert rules' tests) and Kueue's manager (for the Kueue
# tests) from the Go module proxy into a cache outside the repository, and reuses what is already there.
#
#   localcluster/build.sh            build what is missing, print the control plane's bin directory last
#   RESERVOIR_CACHE=/path ...        cache root (default ~/.cache/reservoir)
#   RESERVOIR_KUBERNETES=oldest ...  the oldest supported Kubernetes minor instead of the latest (versions.env)
#
# Every version comes from localcluster/versions.env. A binary is written to a temporary name and moved into
# place only when its build succeeded, so an interrupted build never leaves a half-written binary behind.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=versions.env
source "$here/versions.env"
# RESERVOIR_KUBERNETES picks the Kubernetes set: `latest` (default, KUBERNETES_VERSION) or `oldest` (the oldest minor
# Reservoir supports, KUBERNETES_OLDEST_VERSION); each set is cached in its own directory.
case ${RESERVOIR_KUBERNETES:-latest} in
  latest) ;;
  oldest) KUBERNETES_VERSION=$KUBERNETES_OLDEST_VERSION KUBERNETES_STAGING_VERSION=$KUBERNETES_OLDEST_STAGING_VERSION ;;
  *) printf 'localcluster: RESERVOIR_KUBERNETES=%s: expected latest or oldest\n' "$RESERVOIR_KUBERNETES" >&2; exit 2 ;;
esac

cache=${RESERVOIR_CACHE:-$HOME/.cache/reservoir}
bin="$cache/bin/k8s-$KUBERNETES_VERSION-etcd-$ETCD_VERSION-kwok-$KWOK_VERSION"
helm_bin="$cache/bin/helm-$HELM_VERSION"  # its own directory: a new helm version leaves the control plane cached
work="$cache/build"
mkdir -p "$bin" "$helm_bin" "$work"
export CGO_ENABLED=0 GOFLAGS=-buildvcs=false

log() { printf 'localcluster: %s\n' "$*" >&2; }

# build NAME MODULE_DIR PACKAGE LDFLAGS: go build PACKAGE inside MODULE_DIR into $bin/NAME, timed.
build() {
  local name=$1 dir=$2 pkg=$3 ldflags=$4
  if [[ -x "$bin/$name" ]]; then
    log "$name: cached ($bin/$name)"
    return
  fi
  log "$name: building $pkg (a cold build of all six takes about 8-10 minutes on 2 cores)"
  local start=$SECONDS
  (cd "$dir" && go build -trimpath -ldflags "-s -w $ldflags" -o "$bin/.$name.tmp" "$pkg")
  mv "$bin/.$name.tmp" "$bin/$name"
  log "$name: built in $((SECONDS - start))s"
}

# Wrapper module for k8s.io/kubernetes: it requires the main module and replaces every k8s.io staging module
# (which kubernetes' own go.mod points at ./staging) with its published version. The staging list differs between
# minors (1.30 has legacy-cloud-providers, 1.36 has cri-client, externaljwt...), so it is read from that go.mod.
k8s_mod="$work/kubernetes-$KUBERNETES_VERSION"
if [[ ! -f "$k8s_mod/.ready" ]]; then
  log "kubernetes $KUBERNETES_VERSION: resolving modules (staging modules at $KUBERNETES_STAGING_VERSION)"
  rm -rf "$k8s_mod" && mkdir -p "$k8s_mod"
  k8s_gomod=$(go mod download -json "k8s.io/kubernetes@$KUBERNETES_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  mapfile -t staging < <(sed -n 's/^[[:space:]]*k8s\.io\/\([a-z0-9-]*\) => \.\/staging\/.*/\1/p' "$k8s_gomod")
  (( ${#staging[@]} > 0 )) || { log "kubernetes: no staging replace directive in $k8s_gomod"; exit 1; }
  {
    echo "module reservoir.local/kubernetes"
    echo
    echo "go 1.26.0"
    echo
    echo "require k8s.io/kubernetes $KUBERNETES_VERSION"
    echo
    echo "replace ("
    for m in "${staging[@]}"; do echo "	k8s.io/$m => k8s.io/$m $KUBERNETES_STAGING_VERSION"; done
    echo ")"
    echo
    echo "tool ("
    echo "	k8s.io/kubernetes/cmd/kube-apiserver"
    echo "	k8s.io/kubernetes/cmd/kube-scheduler"
    echo "	k8s.io/kubernetes/cmd/kube-controller-manager"
    echo "	k8s.io/kubernetes/cmd/kubectl"
    echo ")"
  } > "$k8s_mod/go.mod"
  (cd "$k8s_mod" && go mod tidy)
  touch "$k8s_mod/.ready"
fi

etcd_mod="$work/etcd-$ETCD_VERSION"
if [[ ! -f "$etcd_mod/.ready" ]]; then
  log "etcd $ETCD_VERSION: resolving modules"
  rm -rf "$etcd_mod" && mkdir -p "$etcd_mod"
  cp "$here/gomod/etcd/main.go" "$etcd_mod/main.go"
  printf 'module reservoir.local/etcd\n\ngo 1.26.0\n\nrequire go.etcd.io/etcd/server/v3 %s\n' "$ETCD_VERSION" > "$etcd_mod/go.mod"
  (cd "$etcd_mod" && go mod tidy)
  touch "$etcd_mod/.ready"
fi

kwok_mod="$work/kwok-$KWOK_VERSION"
if [[ ! -f "$kwok_mod/.ready" ]]; then
  log "kwok $KWOK_VERSION: resolving modules"
  rm -rf "$kwok_mod" && mkdir -p "$kwok_mod"
  printf 'module reservoir.local/kwok\n\ngo 1.26.0\n\nrequire sigs.k8s.io/kwok %s\n\ntool sigs.k8s.io/kwok/cmd/kwok\n' "$KWOK_VERSION" > "$kwok_mod/go.mod"
  (cd "$kwok_mod" && go mod tidy)
  touch "$kwok_mod/.ready"
fi

minor=${KUBERNETES_VERSION#v1.}; minor=${minor%%.*}
k8s_ldflags="-X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION"
k8s_ldflags+=" -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
k8s_ldflags+=" -X k8s.io/component-base/version.gitTreeState=clean"
k8s_ldflags+=" -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
k8s_ldflags+=" -X k8s.io/client-go/pkg/version.gitMajor=1 -X k8s.io/client-go/pkg/version.gitMinor=$minor"

build etcd "$etcd_mod" . ""
build kwok "$kwok_mod" sigs.k8s.io/kwok/cmd/kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION"
for name in kube-apiserver kube-scheduler kube-controller-manager kubectl; do
  build "$name" "$k8s_mod" "k8s.io/kubernetes/cmd/$name" "$k8s_ldflags"
done

# helm: `go install` of its published module (its go.mod is honoured as is), stamped as helm's own Makefile stamps
# a release: its version, and the Kubernetes version `helm template` and `helm lint` assume (1.<client-go minor>,
# from helm's go.mod) instead of the 1.20 a plain build falls back to.
if [[ -x "$helm_bin/helm" ]]; then
  log "helm: cached ($helm_bin/helm)"
else
  log "helm: building helm.sh/helm/v3/cmd/helm@$HELM_VERSION (about 2-3 minutes on 2 cores)"
  start=$SECONDS
  helm_gomod=$(go mod download -json "helm.sh/helm/v3@$HELM_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  k8s_minor=$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$helm_gomod")
  [[ -n $k8s_minor ]] || { log "helm: no k8s.io/client-go version in $helm_gomod"; exit 1; }
  helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    helm_ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s_minor"
  done
  helm_tmp=$(mktemp -d "$helm_bin/.install.XXXXXX")
  GOBIN="$helm_tmp" go install -trimpath -ldflags "$helm_ldflags" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION"
  mv "$helm_tmp/helm" "$helm_bin/helm"
  rmdir "$helm_tmp"
  log "helm: built in $((SECONDS - start))s"
fi

# promtool (for the alert rules' tests): `go install` of the Prometheus module's cmd/promtool, its go.mod honoured as
# is; `remove_all_sd` leaves out the cloud service discoveries promtool never needs to check or test rules, which
# more than halves a cold build.
promtool_bin="$cache/bin/promtool-$PROMTOOL_VERSION"
if [[ -x "$promtool_bin/promtool" ]]; then
  log "promtool: cached ($promtool_bin/promtool)"
else
  log "promtool: building github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION"
  start=$SECONDS
  mkdir -p "$promtool_bin"
  promtool_tmp=$(mktemp -d "$promtool_bin/.install.XXXXXX")
  GOBIN="$promtool_tmp" go install -trimpath -tags remove_all_sd \
    -ldflags "-s -w -X github.com/prometheus/common/version.Version=3.${PROMTOOL_VERSION#v0.3}" \
    "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION"
  mv "$promtool_tmp/promtool" "$promtool_bin/promtool"
  rmdir "$promtool_tmp"
  log "promtool: built in $((SECONDS - start))s"
fi

# Kueue (the Kueue tests): `go install` of its published module's manager, its go.mod honoured as is; its CRDs and
# webhook manifests copied beside it from the same module, so the tests install exactly the version they run.
kueue_bin="$cache/bin/kueue-$KUEUE_VERSION"
if [[ -x "$kueue_bin/kueue" && -d "$kueue_bin/crd" ]]; then
  log "kueue: cached ($kueue_bin/kueue)"
else
  log "kueue: building sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION (about 2-3 minutes on 2 cores)"
  start=$SECONDS
  mkdir -p "$kueue_bin"
  kueue_dir=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')
  [[ -d $kueue_dir/config/components/crd/bases ]] || { log "kueue: no CRDs in $kueue_dir"; exit 1; }
  kueue_tmp=$(mktemp -d "$kueue_bin/.install.XXXXXX")
  GOBIN="$kueue_tmp" go install -trimpath \
    -ldflags "-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$KUEUE_VERSION" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
  mkdir -p "$kueue_tmp/crd"
  cp "$kueue_dir"/config/components/crd/bases/*.yaml "$kueue_tmp/crd/"
  cp "$kueue_dir/config/components/webhook/manifests.yaml" "$kueue_tmp/webhooks.yaml"
  chmod u+w "$kueue_tmp"/crd/*.yaml "$kueue_tmp/webhooks.yaml"
  rm -rf "$kueue_bin/crd"
  mv "$kueue_tmp/crd" "$kueue_bin/crd"
  mv "$kueue_tmp/webhooks.yaml" "$kueue_bin/webhooks.yaml"
  mv "$kueue_tmp/kueue" "$kueue_bin/kueue"
  rmdir "$kueue_tmp"
  log "kueue: built in $((SECONDS - start))s"
fi

echo "$bin"
