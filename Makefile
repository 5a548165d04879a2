# Two commands matter: `make demo` runs the product locally, `make test` runs every test.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/cocoon-hibernation/target

.PHONY: build release image crd test test-unit install-test soak bench fuzz fuzz-cmin demo demo-down cluster-up cluster-down chart-check chart-release fmt lint

build:
	cargo build --locked

release:
	cargo build --locked --release

# The product image, with buildah from scratch (no daemon), pushed to IMAGE_REPO or the
# local cluster's registry; `bash hack/image.sh --help` for the rest.
image:
	bash hack/image.sh

# The kubectl plugin (release), copied to PLUGIN_DIR (default ~/.cache/cocoon-hibernation/plugin);
# prints where it is and the line that puts it on PATH.
.PHONY: plugin plugin-dist
plugin:
	cargo xtask plugin build $(PLUGIN_DIR)

# The plugin's release tarball (linux/amd64) and its krew manifest with the tarball's sha256.
plugin-dist:
	cargo xtask plugin dist

crd:
	@cargo run --quiet --locked -- crd

# Each of the two commands first installs its Debian packages when run as root, or prints
# the apt-get line and stops (hack/prereqs.sh).
test:
	bash hack/prereqs.sh test
	cargo xtask test

# The tests that need no cluster (lib, bins, tests/unit): what a bare `cargo test` runs.
test-unit:
	bash hack/prereqs.sh unit
	cargo test --locked -- --test-threads=4

# The install suite alone: the chart installed with helm on a real node (kubelet,
# containerd, CNI) from the image `make image` builds; upgrade, failover and uninstall
# under load. Needs root. Also part of `test`.
install-test:
	bash hack/prereqs.sh node
	cargo xtask install-test

# The randomized soak with its own control plane (1,000 CRs by default; SOAK_CRS, SOAK_SEED,
# SOAK_OUT, SOAK_CHAOS_S). A short run (60 CRs) is part of `test`.
soak:
	cargo xtask soak

# The e2e suite and the chart checks against the oldest Kubernetes minor docs/install.md
# claims and against make test's version, each on a control plane of its own (COMPAT_VERSIONS
# to pick others); one result line per version. ~6 min per version, plus ~20 min to build
# another kube-apiserver once. Not in `test` nor .ci/run: it does not fit CI's 90 minutes.
.PHONY: compat
compat:
	cargo xtask compat

# System benchmark on the local control plane (release build; several minutes). Not in `test`.
bench:
	bash hack/prereqs.sh bench
	cargo xtask bench $(BENCH_ARGS)

# Coverage-guided fuzzing (nightly + cargo-fuzz, installed when missing); FUZZ_SECONDS
# per target (default 60), FUZZ_TARGETS to pick some. Not in `test`.
fuzz:
	bash hack/fuzz.sh

# Fold what `make fuzz` found back into fuzz/corpus/, minimized.
fuzz-cmin:
	bash hack/fuzz.sh cmin

# `make demo NODE=1`: on a real node instead, with the image and the Helm chart
# (`cargo xtask demo --node`; needs root). `make demo-down` stops either.
demo:
	bash hack/prereqs.sh $(if $(NODE),node,demo)
	cargo xtask demo $(if $(NODE),--node)

demo-down:
	cargo xtask demo-down

cluster-up:
	cargo xtask cluster-up

cluster-down:
	cargo xtask cluster-down

chart-check:
	cargo xtask chart-check

# When a chart version ships: record its files' digest (hack/chart-releases.txt), so
# `make test` fails when they change without a version bump.
chart-release:
	cargo xtask chart-version --release

fmt:
	cargo fmt --all

# The test = false targets are not in --all-targets, and naming them beside it adds nothing.
lint:
	cargo clippy --locked --all-targets -- -D warnings
	cargo clippy --locked --test e2e --test e2e_alone --test soak --test e2e_install -- -D warnings
