// Validates Argo CD objects against Argo CD's CRD schemas with @kubernetes-models/argo-cd
// (its generated validators, not ours). Reads a JSON array of objects on stdin; prints one
// JSON line per object: {"kind","namespace","name","ok","error"}. Exit status 0 when all
// are valid, 1 otherwise, 2 on unusable input.
import { Application, AppProject, ApplicationSet } from "@kubernetes-models/argo-cd/argoproj.io/v1alpha1";

const kinds = { Application, AppProject, ApplicationSet };
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
  const Model = kinds[o?.kind];
  const line = { kind: o?.kind, namespace: o?.metadata?.namespace ?? "", name: o?.metadata?.name ?? "", ok: true, error: "" };
  try {
    if (!Model) throw new Error(`not an Argo CD kind this validator knows: ${o?.kind}`);
    new Model(o).validate();
  } catch (e) {
    line.ok = false;
    line.error = String(e.message ?? e);
    failed += 1;
  }
  console.log(JSON.stringify(line));
}
process.exit(failed ? 1 : 0);
