# syntax=docker/dockerfile:1.7
# cocoon-hibernation: webhook + controller + admin endpoints in one static-ish binary.
#   docker build -t ghcr.io/cocoonstack/cocoon-hibernation:0.1.0 .
# Needs BuildKit (the default builder since Docker 23) for the cache mounts.

ARG RUST_VERSION=1.95

# ---- build --------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-bookworm AS build
WORKDIR /src

# Only what cargo needs (see .dockerignore, an allow-list). The cache mounts keep the
# registry and target dir between builds, so a source change rebuilds just this crate.
COPY . .
ENV CARGO_TERM_COLOR=never \
    CARGO_INCREMENTAL=0 \
    CARGO_PROFILE_RELEASE_STRIP=symbols
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin cocoon-hibernation \
 && install -D -m 0755 target/release/cocoon-hibernation /out/cocoon-hibernation \
 && /out/cocoon-hibernation crd > /dev/null

# ---- runtime ------------------------------------------------------------------------
# glibc + libgcc, no shell, no package manager; bookworm like the builder.
FROM gcr.io/distroless/cc-debian12:nonroot
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="cocoon-hibernation" \
      org.opencontainers.image.description="Hibernates and wakes VM-backed Kubernetes pods: controller and validating admission webhook" \
      org.opencontainers.image.source="https://github.com/cocoonstack/cocoon-hibernation" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/cocoon-hibernation /cocoon-hibernation
# The chart runs as 65532 too (runAsNonRoot, readOnlyRootFilesystem).
USER 65532:65532
# 8443: HTTPS admission webhook; 8080: /healthz, /readyz, /metrics.
EXPOSE 8443 8080
ENTRYPOINT ["/cocoon-hibernation"]
CMD ["run"]
