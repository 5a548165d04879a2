# Two commands matter: `make demo` runs the product locally, `make test` runs every test.
export CARGO_TARGET_DIR ?= $(HOME)/.cache/cocoon-hibernation/target

.PHONY: build release image crd test install-test soak bench fuzz fuzz-cmin demo demo-down cluster-up cluster-down chart-check chart-release fmt lint

build:
	cargo build --locked

release:
	cargo build --locked --release

# The product image, with buildah from scratch (no daemon), pushed to IMAGE_REPO or the
# local cluster's registry; `bash hack/image.sh --help` for the rest.
image:
	bash hack/image.sh

crd:
	@cargo run --quiet --locked -- crd

test:
	bash hack/test.sh

# The install suite alone: the chart installed with helm on a real node (kubelet,
# containerd, CNI) from the image `make image` builds; upgrade, failover and uninstall
# under load. Needs root. Also part of `test`.
install-test:
	bash hack/install-test.sh

# The randomized soak with its own control plane (1,000 CRs by default; SOAK_CRS, SOAK_SEED,
# SOAK_OUT, SOAK_CHAOS_S). A short run (60 CRs) is part of `test`.
soak:
	bash hack/soak.sh

# System benchmark on the local control plane (release build; several minutes). Not in `test`.
bench:
	bash hack/bench.sh $(BENCH_ARGS)

# Coverage-guided fuzzing (nightly + cargo-fuzz, installed when missing); FUZZ_SECONDS
# per target (default 60), FUZZ_TARGETS to pick some. Not in `test`.
fuzz:
	bash hack/fuzz.sh

# Fold what `make fuzz` found back into fuzz/corpus/, minimized.
fuzz-cmin:
	bash hack/fuzz.sh cmin

# `make demo NODE=1`: on a real node instead, with the image and the Helm chart
# (hack/demo-node.sh; needs root). `make demo-down` stops either.
demo:
	bash hack/$(if $(NODE),demo-node.sh,demo.sh) up

demo-down:
	bash hack/demo.sh down

cluster-up:
	bash hack/cluster-up.sh

cluster-down:
	bash hack/cluster-down.sh

chart-check:
	bash hack/check-chart.sh

# When a chart version ships: record its files' digest (hack/chart-releases.txt), so
# `make test` fails when they change without a version bump.
chart-release:
	python3 hack/chart-version.py --release

fmt:
	cargo fmt --all

lint:
	cargo clippy --locked --all-targets -- -D warnings
