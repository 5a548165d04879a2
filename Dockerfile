# cocoon-hibernation: webhook + controller + admin endpoints in one binary.
# Built by `make image` (hack/image.sh), which compiles the release binary on the host,
# stages a minimal root filesystem (the binary, the kubectl plugin at
# /usr/local/bin/kubectl-cocoon for users to copy out, the shared libraries `ldd` names with
# their loader, Debian's CA bundle, passwd/group with user 65532, an empty /tmp) into a
# context directory and builds this file there with buildah. No base image: nothing is
# pulled, and the image holds only what the process uses.
FROM scratch

ARG VERSION=unknown
ARG REVISION=unknown
ARG CREATED=1970-01-01T00:00:00Z
LABEL org.opencontainers.image.title="cocoon-hibernation" \
      org.opencontainers.image.description="Hibernates and wakes VM-backed Kubernetes pods: controller and validating admission webhook" \
      org.opencontainers.image.source="https://github.com/cocoonstack/cocoon-hibernation" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}"

COPY rootfs/ /
# The chart runs as 65532 too (runAsNonRoot, readOnlyRootFilesystem, an emptyDir on /tmp).
USER 65532:65532
# 8443: HTTPS admission webhook; 8080: /healthz, /readyz, /metrics.
EXPOSE 8443 8080
ENTRYPOINT ["/cocoon-hibernation"]
CMD ["run"]
