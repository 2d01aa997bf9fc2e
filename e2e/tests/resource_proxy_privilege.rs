//! Privilege through the resource proxy is bounded by Kubernetes' Pod Security Standards
//! (baseline by default) and by what the managed owner already references (security issue
//! 39): the real principal with the resource proxy, a real managed agent, and the real
//! `kubectl` with the kubeconfig `argocd-agentctl agent kubeconfig` writes.
//!
//! Each attack test makes one request the agent let through before (a create owned by a
//! managed object, a patch of a managed object) and checks that it is now a `403` naming
//! its rule and that nothing changed on the spoke. The last tests check that what Argo CD
//! itself does still works.
//!
//! kubectl comes from `KUBECTL`, the project virtualenv or PATH (`.ci/run` installs it).

use std::path::PathBuf;
use std::time::Duration;

use argocd_agent_kube_test_server::{KubeTestServer, ResourceType};
use argocd_agent_testkit::harness::*;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};

const T: Duration = Duration::from_secs(30);
/// Application `web` deploys to namespace `web` (`sample_app`).
const NS: &str = "web";
const FORBIDDEN_PATCHES: &str =
    "argocd_agent_resource_proxy_responses_total{verb=\"patch\",outcome=\"forbidden\"}";

/// The topology, the proxy kubeconfig, and the uids of the managed owners.
struct Env {
    topo: Topology,
    kc: PathBuf,
    rs_uid: String,
    cj_uid: String,
}

fn typed(server: &KubeTestServer, group: &str, kind: &str, plural: &str) -> Api<DynamicObject> {
    Api::namespaced_with(
        kube_client(server).unwrap(),
        NS,
        &ApiResource {
            group: group.into(),
            version: "v1".into(),
            api_version: format!("{group}/v1"),
            kind: kind.into(),
            plural: plural.into(),
        },
    )
}

/// The pod template the managed ReplicaSet runs: its own Secret as a volume and an
/// environment variable, no service-account token.
fn owner_pod_spec() -> Value {
    json!({"automountServiceAccountToken": false,
        "volumes": [{"name": "tls", "secret": {"secretName": "web-tls"}}],
        "containers": [{"name": "web", "image": "nginx",
            "env": [{"name": "DB", "valueFrom": {"secretKeyRef": {"name": "web-tls", "key": "db"}}}],
            "volumeMounts": [{"name": "tls", "mountPath": "/tls"}]}]})
}

fn managed(name: &str) -> Value {
    json!({"name": name, "namespace": NS, "labels": {"app.kubernetes.io/instance": "web"}})
}

/// Starts the principal and a managed agent (with `agent_args`), the Application `web`,
/// and on its spoke: a managed ReplicaSet, Pod, Deployment and CronJob, the Application's
/// Secret `web-tls` and an unmanaged Secret `loot`.
async fn setup(agent_args: Vec<String>) -> Env {
    let port = argocd_agent_testkit::envoy::free_loopback_port().unwrap();
    let built_in = |group: &str, plural: &str, kind: &str| {
        ResourceType::new(group, "v1", plural, kind, true, true).built_in(true)
    };
    let topo = Topology::start(TopologyOptions {
        principal_args: vec![
            "--enable-resource-proxy".into(),
            "--resource-proxy-address".into(),
            format!("127.0.0.1:{port}"),
            "--enable-self-cluster-registration".into(),
        ],
        agents: Some(vec![MANAGED]),
        agent_args,
        spoke_resources: vec![
            built_in("apps", "deployments", "Deployment"),
            built_in("apps", "replicasets", "ReplicaSet"),
            built_in("batch", "cronjobs", "CronJob"),
            built_in("batch", "jobs", "Job"),
        ],
        dir: std::env::var_os("E2E_DIR").map(PathBuf::from),
        ..Default::default()
    })
    .await
    .unwrap();
    topo.wait_connected(MANAGED, T).await.unwrap();
    apps(&topo.hub, MANAGED)
        .unwrap()
        .create(
            &PostParams::default(),
            &sample_app("web", MANAGED, "guestbook"),
        )
        .await
        .unwrap();
    eventually("the managed Application on its spoke", T, || async {
        stored_app(&topo.managed_spoke, SPOKE_NS, "web")
    })
    .await
    .unwrap();
    let (rs_uid, cj_uid) = seed(&topo.managed_spoke).await;
    eventually("the cluster secret", T, || async {
        stored_secret(&topo.hub, HUB_ARGOCD_NS, &format!("cluster-{MANAGED}"))
    })
    .await
    .unwrap();
    let kc = agent_kubeconfig(&topo.dir, MANAGED).await;
    Env {
        topo,
        kc,
        rs_uid,
        cj_uid,
    }
}

/// The spoke's objects; returns the ReplicaSet's and the CronJob's uids.
async fn seed(spoke: &KubeTestServer) -> (String, String) {
    create_namespace(spoke, NS).await.unwrap();
    let pp = PostParams::default();
    let secrets = core_api(spoke, NS, "secrets", "Secret");
    for (_, meta) in [
        ("web-tls", managed("web-tls")),
        ("loot", json!({"name": "loot", "namespace": NS})),
    ] {
        let s = json!({"apiVersion": "v1", "kind": "Secret", "metadata": meta,
            "stringData": {"db": "password"}});
        secrets.create(&pp, &object(s)).await.unwrap();
    }
    let rs = typed(spoke, "apps", "ReplicaSet", "replicasets")
        .create(
            &pp,
            &object(json!({"apiVersion": "apps/v1", "kind": "ReplicaSet",
                "metadata": managed("web-rs"),
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}}, "spec": owner_pod_spec()}}})),
        )
        .await
        .unwrap();
    core_api(spoke, NS, "pods", "Pod")
        .create(
            &pp,
            &object(
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": managed("web-0"),
                "spec": {"automountServiceAccountToken": false,
                    "containers": [{"name": "web", "image": "nginx"}]}}),
            ),
        )
        .await
        .unwrap();
    typed(spoke, "apps", "Deployment", "deployments")
        .create(
            &pp,
            &object(json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": managed("web"),
                "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "web"}},
                    "template": {"metadata": {"labels": {"app": "web"}}, "spec": owner_pod_spec()}}})),
        )
        .await
        .unwrap();
    let cj = typed(spoke, "batch", "CronJob", "cronjobs")
        .create(
            &pp,
            &object(
                json!({"apiVersion": "batch/v1", "kind": "CronJob", "metadata": managed("nightly"),
                "spec": {"schedule": "0 1 * * *", "jobTemplate": {"spec": {"template": {"spec":
                    {"restartPolicy": "Never", "automountServiceAccountToken": false,
                     "containers": [{"name": "run", "image": "busybox"}]}}}}}}),
            ),
        )
        .await
        .unwrap();
    (rs.metadata.uid.unwrap(), cj.metadata.uid.unwrap())
}

/// `kubectl create -f` of `body` through the proxy.
async fn kubectl_create(env: &Env, name: &str, body: &Value) -> std::process::Output {
    let file = env.topo.dir.join(format!("{name}.json"));
    std::fs::write(&file, body.to_string()).unwrap();
    let file = file.to_str().unwrap();
    run_kubectl(&env.kc, &["create", "--validate=false", "-f", file]).await
}

/// `kubectl patch <what> -n web --type <ty> -p <patch>` through the proxy.
async fn kubectl_patch(env: &Env, what: &[&str], ty: &str, patch: &Value) -> std::process::Output {
    let patch = patch.to_string();
    let mut args = vec!["patch"];
    args.extend_from_slice(what);
    args.extend_from_slice(&["-n", NS, "--type", ty, "-p", &patch]);
    run_kubectl(&env.kc, &args).await
}

/// The request was a `403` whose message contains `why`.
fn assert_forbidden(o: &std::process::Output, why: &str) {
    let text = output_text(o);
    assert!(!o.status.success(), "must be refused: {text}");
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.contains("(Forbidden)"), "{text}");
    assert!(stderr.contains(why), "the refusal must say {why:?}: {text}");
}

/// A Pod owned by the managed ReplicaSet, its spec the ReplicaSet's template changed by
/// `edit`.
fn pod_from_rs(env: &Env, name: &str, edit: impl FnOnce(&mut Value)) -> Value {
    let mut spec = owner_pod_spec();
    edit(&mut spec);
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": {"app": "web"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-rs",
                "uid": env.rs_uid, "controller": true}]},
        "spec": spec})
}

/// A create owned by the managed ReplicaSet, changed by `edit`, is refused with `why` and
/// no Pod is made.
async fn create_is_refused(why: &str, edit: impl FnOnce(&mut Value)) {
    let env = setup(Vec::new()).await;
    let body = pod_from_rs(&env, "evil", edit);
    let o = kubectl_create(&env, "evil", &body).await;
    assert_forbidden(&o, why);
    let spoke = &env.topo.managed_spoke;
    assert!(
        spoke
            .get_object("", "v1", "pods", Some(NS), "evil")
            .is_none()
    );
    env.topo.stop().await;
}

macro_rules! create_attack {
    ($(#[$doc:meta])* $name:ident, $why:expr, |$spec:ident| $edit:block) => {
        $(#[$doc])*
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            create_is_refused($why, |$spec: &mut Value| $edit).await;
        }
    };
}

create_attack!(
    /// `runAsUser: 0` where the owner sets no user.
    create_running_as_root_is_refused,
    "runAsUser 0 (root)",
    |spec| { spec["containers"][0]["securityContext"] = json!({"runAsUser": 0}) }
);
create_attack!(
    /// `nodeName`: the scheduler is bypassed (a control-plane node, say).
    create_pinned_to_a_node_is_refused,
    "nodeName control-plane-1",
    |spec| { spec["nodeName"] = json!("control-plane-1") }
);
create_attack!(
    /// `operator: Exists` without a key tolerates every taint.
    create_tolerating_every_taint_is_refused,
    "toleration of every taint",
    |spec| { spec["tolerations"] = json!([{"operator": "Exists"}]) }
);
create_attack!(
    /// A volume of a Secret the owner does not reference (whose contents the new, managed
    /// pod's logs could then show).
    create_mounting_an_unmanaged_secret_is_refused,
    "secret loot",
    |spec| { spec["volumes"][0]["secret"]["secretName"] = json!("loot") }
);
create_attack!(
    /// A `secretKeyRef` to a Secret the owner does not reference.
    create_reading_an_unmanaged_secret_into_env_is_refused,
    "secret loot",
    |spec| { spec["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"]["name"] = json!("loot") }
);
create_attack!(
    /// The service-account token mounted where the owner turns it off.
    create_with_an_automounted_token_is_refused,
    "automountServiceAccountToken",
    |spec| { spec["automountServiceAccountToken"] = json!(true) }
);
create_attack!(
    /// An nfs volume (any server, any path).
    create_with_an_nfs_volume_is_refused,
    "volume type nfs",
    |spec| { spec["volumes"].as_array_mut().unwrap().push(json!({"name": "n", "nfs": {"server": "10.0.0.1", "path": "/"}})) }
);
create_attack!(
    /// A csi volume (a driver reaching outside the pod).
    create_with_a_csi_volume_is_refused,
    "volume type csi",
    |spec| { spec["volumes"].as_array_mut().unwrap().push(json!({"name": "c", "csi": {"driver": "secrets-store.csi.k8s.io"}})) }
);
create_attack!(
    /// A `kernel.*` sysctl outside the safe set.
    create_with_a_kernel_sysctl_is_refused,
    "kernel.msgmax",
    |spec| { spec["securityContext"] = json!({"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]}) }
);
create_attack!(
    /// A runtime class the owner does not use.
    create_with_a_runtime_class_is_refused,
    "runtimeClassName unconfined",
    |spec| { spec["runtimeClassName"] = json!("unconfined") }
);
create_attack!(
    /// `priorityClassName: system-node-critical` (evicts others, never evicted).
    create_with_system_node_critical_priority_is_refused,
    "priorityClassName system-node-critical",
    |spec| { spec["priorityClassName"] = json!("system-node-critical") }
);
create_attack!(
    /// A projected service-account token for an audience of the caller's choosing.
    create_with_a_projected_token_is_refused,
    "serviceAccountToken audience vault",
    |spec| {
        spec["volumes"].as_array_mut().unwrap().push(json!({"name": "t", "projected": {"sources": [
            {"serviceAccountToken": {"audience": "vault", "path": "token"}}]}}))
    }
);

/// A patch of the managed pod `web-0` (or `what`) is refused with `why` and the object is
/// as it was; the refusal is counted.
async fn patch_is_refused(what: [&str; 2], ty: &str, patch: Value, why: &str) {
    let env = setup(Vec::new()).await;
    let spoke = &env.topo.managed_spoke;
    let (group, plural) = match what[0] {
        "deployment" => ("apps", "deployments"),
        _ => ("", "pods"),
    };
    let before = spoke
        .get_object(group, "v1", plural, Some(NS), what[1])
        .unwrap();
    let o = kubectl_patch(&env, &what, ty, &patch).await;
    assert_forbidden(&o, why);
    let after = spoke
        .get_object(group, "v1", plural, Some(NS), what[1])
        .unwrap();
    for part in ["/spec", "/metadata/labels", "/metadata/annotations"] {
        assert_eq!(
            before.pointer(part),
            after.pointer(part),
            "the refused patch changed {part}"
        );
    }
    let metrics = env.topo.metrics_ports[MANAGED];
    assert_eq!(metric_sum(metrics, FORBIDDEN_PATCHES).await, 1.0);
    env.topo.stop().await;
}

const POD: [&str; 2] = ["pod", "web-0"];

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn strategic_merge_patch_adding_host_network_is_refused() {
    let patch = json!({"spec": {"hostNetwork": true}});
    let why = "pod security \"baseline\": spec.hostNetwork is true (check hostNamespaces)";
    patch_is_refused(POD, "strategic", patch, why).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn strategic_merge_patch_adding_host_pid_is_refused() {
    let patch = json!({"spec": {"hostPID": true}});
    patch_is_refused(
        POD,
        "strategic",
        patch,
        "spec.hostPID is true (check hostNamespaces)",
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn strategic_merge_patch_adding_a_host_path_is_refused() {
    let patch = json!({"spec": {"volumes": [{"name": "root", "hostPath": {"path": "/"}}]}});
    let why = "spec.volumes[0].hostPath is set (path \"/\") (check hostPathVolumes)";
    patch_is_refused(POD, "strategic", patch, why).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn strategic_merge_patch_making_a_container_privileged_is_refused() {
    // Merged into the existing container by name, as the API server merges it.
    let patch =
        json!({"spec": {"containers": [{"name": "web", "securityContext": {"privileged": true}}]}});
    let why = "pod security \"baseline\": spec.containers[0].securityContext.privileged is true (check privileged)";
    patch_is_refused(POD, "strategic", patch, why).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn merge_patch_dropping_the_instance_label_is_refused() {
    let patch = json!({"metadata": {"labels": {"app.kubernetes.io/instance": null}}});
    let why = "may not change metadata.labels[\"app.kubernetes.io/instance\"]";
    patch_is_refused(POD, "merge", patch, why).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn merge_patch_handing_the_object_to_another_application_is_refused() {
    let patch = json!({"metadata": {"labels": {"app.kubernetes.io/instance": "other"}}});
    patch_is_refused(POD, "merge", patch, "which tracks the object for Argo CD").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn merge_patch_unconfining_app_armor_is_refused() {
    let patch = json!({"metadata": {"annotations": {APPARMOR: "unconfined"}}});
    let why = "is \"unconfined\" (check appArmorProfile)";
    patch_is_refused(POD, "merge", patch, why).await;
}

const APPARMOR: &str = "container.apparmor.security.beta.kubernetes.io/web";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deployment_template_made_privileged_by_a_merge_patch_is_refused() {
    // A merge patch replaces the containers list: the result is what is judged.
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx",
        "securityContext": {"privileged": true}}]}}}});
    let why =
        "spec.template.spec.containers[0].securityContext.privileged is true (check privileged)";
    patch_is_refused(["deployment", "web"], "merge", patch, why).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deployment_template_given_a_host_path_by_a_json_patch_is_refused() {
    let patch = json!([{"op": "add", "path": "/spec/template/spec/volumes/-",
        "value": {"name": "root", "hostPath": {"path": "/"}}}]);
    let why = "spec.template.spec.volumes[1].hostPath is set (path \"/\") (check hostPathVolumes)";
    patch_is_refused(["deployment", "web"], "json", patch, why).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deployment_template_reading_an_unmanaged_secret_is_refused() {
    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "web",
        "envFrom": [{"secretRef": {"name": "loot"}}]}]}}}});
    patch_is_refused(["deployment", "web"], "strategic", patch, "secret loot").await;
}

/// A Job owned by the managed CronJob whose template escalates where the CronJob's does
/// not: refused, and no Job is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn job_whose_template_escalates_is_refused() {
    let env = setup(Vec::new()).await;
    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "nightly-manual", "namespace": NS,
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
                "uid": env.cj_uid, "controller": true}]},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "automountServiceAccountToken": false,
            "securityContext": {"sysctls": [{"name": "kernel.msgmax", "value": "65536"}]},
            "containers": [{"name": "run", "image": "busybox",
                "env": [{"name": "PW", "valueFrom": {"secretKeyRef": {"name": "loot", "key": "db"}}}]}]}}}});
    let o = kubectl_create(&env, "job", &job).await;
    assert_forbidden(&o, "sysctl kernel.msgmax");
    assert_forbidden(&o, "secret loot");
    let spoke = &env.topo.managed_spoke;
    assert!(
        spoke
            .get_object("batch", "v1", "jobs", Some(NS), "nightly-manual")
            .is_none()
    );
    env.topo.stop().await;
}

/// What Argo CD does keeps working: a Pod owned by the managed ReplicaSet with the
/// ReplicaSet's own volumes and Secret, a label patch that keeps the tracking, a strategic
/// merge patch of the Deployment's image, and the create-job action's Job.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn legitimate_creates_and_patches_still_succeed() {
    let env = setup(Vec::new()).await;
    let spoke = &env.topo.managed_spoke;
    let pod = pod_from_rs(&env, "web-rs-abcde", |_| {});
    let o = kubectl_create(&env, "pod", &pod).await;
    assert!(o.status.success(), "{}", output_text(&o));
    assert!(
        spoke
            .get_object("", "v1", "pods", Some(NS), "web-rs-abcde")
            .is_some()
    );

    let o = kubectl_patch(
        &env,
        &POD,
        "merge",
        &json!({"metadata": {"labels": {"tier": "front"}}}),
    )
    .await;
    assert!(o.status.success(), "{}", output_text(&o));
    let pod = spoke
        .get_object("", "v1", "pods", Some(NS), "web-0")
        .unwrap();
    assert_eq!(pod["metadata"]["labels"]["tier"], json!("front"));
    assert_eq!(
        pod["metadata"]["labels"]["app.kubernetes.io/instance"],
        json!("web")
    );

    let patch = json!({"spec": {"template": {"spec": {"containers": [{"name": "web", "image": "nginx:1.27"}]}}}});
    let o = kubectl_patch(&env, &["deployment", "web"], "strategic", &patch).await;
    assert!(o.status.success(), "{}", output_text(&o));
    let d = spoke
        .get_object("apps", "v1", "deployments", Some(NS), "web")
        .unwrap();
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["image"], json!("nginx:1.27"));
    assert_eq!(
        c["env"][0]["name"],
        json!("DB"),
        "merged by name, not replaced"
    );

    let job = json!({"apiVersion": "batch/v1", "kind": "Job",
        "metadata": {"name": "nightly-manual", "namespace": NS,
            "ownerReferences": [{"apiVersion": "batch/v1", "kind": "CronJob", "name": "nightly",
                "uid": env.cj_uid, "controller": true}]},
        "spec": {"template": {"spec": {"restartPolicy": "Never", "automountServiceAccountToken": false,
            "containers": [{"name": "run", "image": "busybox"}]}}}});
    let o = kubectl_create(&env, "job", &job).await;
    assert!(o.status.success(), "{}", output_text(&o));
    let metrics = env.topo.metrics_ports[MANAGED];
    assert_eq!(metric_sum(metrics, FORBIDDEN_PATCHES).await, 0.0);
    env.topo.stop().await;
}

/// `--resource-proxy-pod-security restricted`: a pod that baseline admits but that runs
/// without the restricted hardening is refused, naming the level; `privileged` turns the
/// Pod Security checks off (the owner comparison stays).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_spoke_chooses_the_pod_security_level() {
    let flag = |level: &str| vec!["--resource-proxy-pod-security".to_owned(), level.to_owned()];
    let env = setup(flag("restricted")).await;
    let pod = pod_from_rs(&env, "web-rs-abcde", |_| {});
    let o = kubectl_create(&env, "pod", &pod).await;
    assert_forbidden(&o, "pod security \"restricted\"");
    assert_forbidden(&o, "(check allowPrivilegeEscalation)");
    let patch = json!({"metadata": {"labels": {"tier": "front"}}});
    let o = kubectl_patch(&env, &POD, "merge", &patch).await;
    assert!(
        o.status.success(),
        "what the pod already breaks is not new: {}",
        output_text(&o)
    );
    env.topo.stop().await;

    let env = setup(flag("privileged")).await;
    let patch = json!({"metadata": {"annotations": {APPARMOR: "unconfined"}}});
    let o = kubectl_patch(&env, &POD, "merge", &patch).await;
    assert!(o.status.success(), "{}", output_text(&o));
    let patch = json!({"spec": {"hostPID": true}});
    let o = kubectl_patch(&env, &POD, "strategic", &patch).await;
    assert_forbidden(&o, "hostPID that it does not have now");
    let patch = json!({"spec": {"template": {"spec": {"nodeName": "control-plane-1"}}}});
    let o = kubectl_patch(&env, &["deployment", "web"], "merge", &patch).await;
    assert_forbidden(&o, "nodeName control-plane-1");
    env.topo.stop().await;
}
