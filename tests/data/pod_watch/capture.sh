#!/bin/bash
# Captures one pod watch (streamed initial list) as protobuf and as JSON from a real
# apiserver, for src/cache/pod_wire/tests.rs. Usage: capture.sh STATE_DIR OUT_DIR, on a
# cluster from `cargo xtask cluster-up`.
set -euo pipefail
S=$1; OUT=$2
set -a
# shellcheck source=/dev/null
. "$S/env"
set +a
kubectl create namespace wire >/dev/null 2>&1 || true
cat <<'Y' | kubectl apply -n wire -f - >/dev/null
apiVersion: v1
kind: Pod
metadata:
  name: running
  labels: {app: sandbox, cocoonset.cocoonstack.io/set: bench}
  annotations:
    vm.cocoonstack.io/name: vm-running
    vm.cocoonstack.io/id: vmid-1
    vm.cocoonstack.io/lifecycle-state: ready
    cocoonset.cocoonstack.io/generation: "2"
    prometheus.io/scrape: "true"
  finalizers: [example.com/keep]
  ownerReferences:
  - {apiVersion: v1, kind: ConfigMap, name: owner, uid: 6f1c1d9e-1f7e-4d4b-9d1e-2a7c3c0a9b11, controller: true, blockOwnerDeletion: false}
spec:
  nodeName: vk-cocoon-0
  containers:
  - {name: vm, image: registry.example.com/cocoon/vm:1.4.2, env: [{name: MODE, value: prod}]}
  - {name: agent, image: registry.example.com/cocoon/agent:0.9.1}
---
apiVersion: v1
kind: Pod
metadata:
  name: hibernated
  annotations: {vm.cocoonstack.io/name: vm-hibernated, vm.cocoonstack.io/hibernate: "true", vm.cocoonstack.io/lifecycle-state: hibernated}
spec:
  nodeName: vk-cocoon-0
  containers:
  - {name: vm, image: registry.example.com/cocoon/vm:1.4.2}
Y
kubectl patch pod running -n wire --subresource=status --type=merge -p '{"status":{"phase":"Running","containerStatuses":[{"name":"agent","image":"a","imageID":"","ready":false,"restartCount":0,"state":{"waiting":{"reason":"ContainerCreating"}}},{"name":"vm","image":"v","imageID":"","ready":true,"restartCount":0,"state":{"running":{"startedAt":"2026-12-06T00:00:00Z"}}}]}}' >/dev/null
kubectl patch pod hibernated -n wire --subresource=status --type=merge -p '{"status":{"phase":"Running","containerStatuses":[{"name":"vm","image":"v","imageID":"","ready":false,"restartCount":1,"state":{"terminated":{"exitCode":0,"startedAt":"2026-12-06T00:00:00Z","finishedAt":"2026-12-06T00:01:00Z"}}}]}}' >/dev/null
kubectl delete pod hibernated -n wire --wait=false >/dev/null
K=$KUBECONFIG
grep client-certificate-data "$K" | awk '{print $2}' | base64 -d > /tmp/fx-c.crt; grep client-key-data "$K" | awk '{print $2}' | base64 -d > /tmp/fx-c.key
U="$COCOON_APISERVER_URL/api/v1/namespaces/wire/pods?watch=true&sendInitialEvents=true&allowWatchBookmarks=true&resourceVersionMatch=NotOlderThan&timeoutSeconds=2"
for fmt in json protobuf; do
python3 - "$U" "$fmt" "$OUT/pod-watch.$fmt" "$COCOON_CA_CERT" <<'PY'
import ssl,sys,http.client,urllib.parse
u=urllib.parse.urlparse(sys.argv[1]); ctx=ssl.create_default_context(cafile=sys.argv[4]); ctx.load_cert_chain('/tmp/fx-c.crt','/tmp/fx-c.key')
c=http.client.HTTPSConnection(u.hostname,u.port,context=ctx)
accept={'json':'application/json','protobuf':'application/vnd.kubernetes.protobuf'}[sys.argv[2]]
c.request('GET',u.path+'?'+u.query,headers={'Accept':accept}); r=c.getresponse()
data=b''
while True:
    b=r.read1(65536)
    if not b: break
    data+=b
open(sys.argv[3],'wb').write(data)
print(sys.argv[2], r.status, r.getheader('Content-Type'), len(data))
PY
done
