// Validates Kubernetes objects against Kubernetes' own OpenAPI schemas (npm kubernetes-models)
// and, for the custom kinds the deploy files use, against Istio's, the Gateway API's and the Prometheus
// Operator's CRD schemas (@kubernetes-models/istio, @kubernetes-models/prometheus-operator):
// generated validators, not ours. Reads a JSON array of objects on stdin; prints one JSON line
// per object: {"apiVersion","kind","name","ok","known","error"}. `known` is false for a kind
// none of these packages has a model for (the caller decides whether that is acceptable).
// Exit status 0 when every known object is valid, 1 otherwise, 2 on unusable input.

// Where each API group's models live.
function modulePath(apiVersion) {
  const [group, version] = apiVersion.includes("/") ? apiVersion.split("/") : ["", apiVersion];
  if (group === "") return `kubernetes-models/${version}`;
  if (group.endsWith(".istio.io")) return `@kubernetes-models/istio/${group}/${version}`;
  if (group === "gateway.networking.k8s.io") return `@kubernetes-models/gateway-api/${group}/${version}`;
  if (group === "monitoring.coreos.com") return `@kubernetes-models/prometheus-operator/${group}/${version}`;
  if (group.includes(".") && !group.endsWith(".k8s.io")) return null;
  return `kubernetes-models/${group}/${version}`;
}

async function model(apiVersion, kind) {
  const path = modulePath(apiVersion ?? "");
  if (!path) return null;
  try {
    const mod = await import(path);
    return mod[kind] ?? null;
  } catch {
    return null;
  }
}

let input = "";
process.stdin.setEncoding("utf8");
for await (const chunk of process.stdin) input += chunk;
let objects;
try {
  objects = JSON.parse(input);
  if (!Array.isArray(objects)) throw new Error("expected a JSON array");
} catch (e) {
  console.error(`unusable input: ${e.message}`);
  process.exit(2);
}
let failed = 0;
for (const o of objects) {
  const line = { apiVersion: o?.apiVersion, kind: o?.kind, name: o?.metadata?.name ?? "", ok: true, known: true, error: "" };
  const Model = await model(o?.apiVersion, o?.kind);
  if (!Model) {
    line.known = false;
  } else {
    try {
      new Model(o).validate();
    } catch (e) {
      line.ok = false;
      line.error = String(e.message ?? e);
      failed += 1;
    }
  }
  console.log(JSON.stringify(line));
}
process.exit(failed ? 1 : 0);
