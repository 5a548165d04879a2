#!/usr/bin/env bash
# Installs the chart tooling (helm, kubeconform, the helm-unittest plugin, promtool) from
# the Go module proxy into a cache outside the repo, one directory per tool and version:
#   ${COCOON_CACHE:-$HOME/.cache/cocoon-hibernation}/tools/<name>-<version>/<name>
# and links them into tools/bin-helm-<v>-kubeconform-<v>-unittest-<v>-promtool-<v>/ (one
# dir per version set). helm-unittest is laid out as a Helm plugin in <bin>/helm-plugins:
#   export HELM_PLUGINS="$bin/helm-plugins"; helm unittest CHART
# Idempotent: a tool already present is not rebuilt. Needs Go >= 1.24 on a cold cache.
# Serialized by a lock file in the cache, so concurrent callers build once.
# Prints that bin dir on its last line, e.g.
#   export PATH="$(bash hack/install-tools.sh | tail -n 1):$PATH"
set -euo pipefail

HELM_VERSION="${HELM_VERSION:-v3.21.4}"
HELM_V4_VERSION="${HELM_V4_VERSION:-v4.3.2}"
KUBECONFORM_VERSION="${KUBECONFORM_VERSION:-v0.8.0}"
HELM_UNITTEST_VERSION="${HELM_UNITTEST_VERSION:-v1.1.2}"
# Prometheus' Go module is tagged v0.<minor>.<patch> for release 3.<minor>.<patch>.
PROMTOOL_VERSION="${PROMTOOL_VERSION:-v0.316.0}"
CACHE_ROOT="${COCOON_CACHE:-$HOME/.cache/cocoon-hibernation}"
TOOLS="$CACHE_ROOT/tools"

log() { echo "[install-tools] $*" >&2; }
die() { log "ERROR: $*"; exit 1; }

need_go() { command -v go >/dev/null || die "go is required to build $1 (install Go >= 1.24)"; }

# go_install NAME VERSION PACKAGE@VERSION LDFLAGS [MODULE]: builds into $TOOLS/NAME-VERSION
# unless already there. Echoes the bin dir. Non-zero if the build fails (partial output
# removed). With MODULE (module path), builds inside that module's source at VERSION, for
# modules whose go.mod has replace directives (`go install pkg@v` refuses those).
# GO_TAGS (environment) passes build tags.
go_install() {
  local name="$1" version="$2" pkg="$3" ldflags="$4" module="${5:-}" dir="$TOOLS/$1-$2"
  if [[ -x "$dir/$name" ]]; then
    log "cached: $dir/$name"
    echo "$dir"
    return 0
  fi
  need_go "$name"
  log "building $pkg (a few minutes on a cold Go cache)"
  mkdir -p "$dir"
  local start=$SECONDS
  # A clean GOFLAGS: a caller's -mod=vendor or similar must not leak into go install.
  local src=""
  if [[ -n "$module" ]]; then
    src="$(cd "$TOOLS" && GOFLAGS='' go mod download -json "$module@$version" |
      sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
    [[ -d "$src" ]] || { rm -rf "$dir"; return 1; }
  fi
  if [[ -n "$src" ]]; then
    if ! (cd "$src" && CGO_ENABLED=0 GOFLAGS="-buildvcs=false -mod=readonly" \
          go build -trimpath -tags="${GO_TAGS:-}" -ldflags="-s -w $ldflags" -o "$dir/$name" "./${pkg#"$module"/}" >&2); then
      rm -rf "$dir"
      return 1
    fi
  elif ! (cd "$TOOLS" && CGO_ENABLED=0 GOBIN="$dir" GOFLAGS=-buildvcs=false \
        go install -trimpath -tags="${GO_TAGS:-}" -ldflags="-s -w $ldflags" "$pkg" >&2); then
    rm -rf "$dir"
    return 1
  fi
  [[ -x "$dir/$name" ]] || { rm -rf "$dir"; return 1; }
  log "built $name $version in $((SECONDS - start))s"
  echo "$dir"
}

# helm_ldflags MAJOR VERSION: what helm's Makefile sets. Without the Kubernetes version
# flags `helm template` assumes Kubernetes v1.20 and refuses charts needing newer.
helm_ldflags() {
  local major="$1" version="$2" gomod client_go kmajor kminor
  [[ -x "$TOOLS/helm-$version/helm" ]] && return 0 # cached; flags unused
  need_go helm
  gomod="$(cd "$TOOLS" && GOFLAGS='' go mod download -json "helm.sh/helm/$major@$version" |
    sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')" || return 1
  [[ -f "$gomod" ]] || return 1
  client_go="$(awk '$1 == "k8s.io/client-go" { print $2; exit }' "$gomod")" # v0.36.2
  [[ "$client_go" =~ ^v0\.([0-9]+)\. ]] || return 1
  kmajor=1 kminor="${BASH_REMATCH[1]}"
  local p="helm.sh/helm/$major"
  local flags="-X $p/internal/version.version=$version"
  if [[ "$major" == v3 ]]; then
    flags+=" -X $p/pkg/chartutil.k8sVersionMajor=$kmajor -X $p/pkg/chartutil.k8sVersionMinor=$kminor"
    flags+=" -X $p/pkg/lint/rules.k8sVersionMajor=$kmajor -X $p/pkg/lint/rules.k8sVersionMinor=$kminor"
  else
    flags+=" -X $p/internal/version.kubeClientVersionMajor=$kmajor -X $p/internal/version.kubeClientVersionMinor=$kminor"
    flags+=" -X $p/pkg/chart/common.k8sVersionMajor=$kmajor -X $p/pkg/chart/common.k8sVersionMinor=$kminor"
    flags+=" -X $p/pkg/chart/v2/lint/rules.k8sVersionMajor=$kmajor -X $p/pkg/chart/v2/lint/rules.k8sVersionMinor=$kminor"
  fi
  echo "$flags"
}

mkdir -p "$TOOLS"
# One install at a time: test processes (testkit/src/product.rs) and the chart checks
# may call this concurrently against one cache.
command -v flock >/dev/null || die "flock is required (apt-get install util-linux)"
exec 9>"$TOOLS/.lock"
flock 9

# helm: v3 first; fall back to v4 if the v3 build fails.
helm_dir=""
if flags="$(helm_ldflags v3 "$HELM_VERSION")"; then
  helm_dir="$(go_install helm "$HELM_VERSION" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" "$flags")" || helm_dir=""
fi
if [[ -z "$helm_dir" ]]; then
  log "helm $HELM_VERSION failed to build; trying helm $HELM_V4_VERSION"
  flags="$(helm_ldflags v4 "$HELM_V4_VERSION")" || die "cannot read helm $HELM_V4_VERSION's go.mod"
  helm_dir="$(go_install helm "$HELM_V4_VERSION" "helm.sh/helm/v4/cmd/helm@$HELM_V4_VERSION" "$flags")" ||
    die "could not build helm $HELM_VERSION or $HELM_V4_VERSION"
fi

kubeconform_dir="$(go_install kubeconform "$KUBECONFORM_VERSION" \
  "github.com/yannh/kubeconform/cmd/kubeconform@$KUBECONFORM_VERSION" \
  "-X main.version=$KUBECONFORM_VERSION")" ||
  die "could not build kubeconform $KUBECONFORM_VERSION"

unittest_dir="$(go_install helm-unittest "$HELM_UNITTEST_VERSION" \
  "github.com/helm-unittest/helm-unittest/cmd/helm-unittest" \
  "-X github.com/helm-unittest/helm-unittest/internal/build.version=${HELM_UNITTEST_VERSION#v}" \
  github.com/helm-unittest/helm-unittest)" ||
  die "could not build helm-unittest $HELM_UNITTEST_VERSION"

# remove_all_sd: no service-discovery plugins (cloud SDKs); rule tests need none of them,
# and the build takes a fraction of the time.
promtool_dir="$(GO_TAGS=remove_all_sd go_install promtool "$PROMTOOL_VERSION" \
  "github.com/prometheus/prometheus/cmd/promtool@$PROMTOOL_VERSION" \
  "-X github.com/prometheus/common/version.Version=${PROMTOOL_VERSION#v}")" ||
  die "could not build promtool $PROMTOOL_VERSION"

bin="$TOOLS/bin-$(basename "$helm_dir")-kubeconform-$KUBECONFORM_VERSION"
bin+="-unittest-$HELM_UNITTEST_VERSION-promtool-$PROMTOOL_VERSION"
mkdir -p "$bin/helm-plugins/unittest"
ln -sfn "$helm_dir/helm" "$bin/helm"
ln -sfn "$kubeconform_dir/kubeconform" "$bin/kubeconform"
ln -sfn "$promtool_dir/promtool" "$bin/promtool"
ln -sfn "$unittest_dir/helm-unittest" "$bin/helm-plugins/unittest/untt"
# The plugin manifest Helm reads from $HELM_PLUGINS/unittest (what `helm plugin install`
# would lay down, minus its download hooks).
cat >"$bin/helm-plugins/unittest/plugin.yaml" <<EOF
name: "unittest"
version: "${HELM_UNITTEST_VERSION#v}"
usage: "unittest for helm charts"
description: "helm-unittest, built from the Go module proxy by hack/install-tools.sh"
ignoreFlags: false
command: "\$HELM_PLUGIN_DIR/untt"
EOF

log "helm $("$bin/helm" version --short 2>/dev/null), kubeconform $("$bin/kubeconform" -v)," \
  "helm-unittest $HELM_UNITTEST_VERSION, $("$bin/promtool" --version 2>&1 | head -n 1)"
echo "$bin"
