# The node harness's pause (sandbox) image: Debian's busybox-static and nothing else.
# Built by `hack/image.sh pause` from a context holding rootfs/bin/busybox.
FROM scratch
COPY rootfs/ /
USER 65535:65535
# Sleeps until SIGTERM/SIGINT and then exits 0 (a plain `sleep` as PID 1 ignores SIGTERM,
# which makes every sandbox stop wait for SIGKILL).
ENTRYPOINT ["/bin/busybox", "sh", "-c", "trap 'kill $! 2>/dev/null; exit 0' TERM INT; while :; do /bin/busybox sleep 3600 & wait $!; done"]
