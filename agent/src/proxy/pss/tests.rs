//! One test per Pod Security Standards check, then levels, placement and comparison.

use serde_json::{Value, json};

use super::*;

/// [`super::check`] with its refusal as the text kubectl users read.
fn check(level: Level, obj: &Value, before: Option<&Value>) -> Result<(), String> {
    super::check(level, obj, before).map_err(|e| e.to_string())
}

/// The fields of the violations `check` finds in a Pod with `spec` (and `metadata`).
fn fields_with(check: Check, spec: Value, metadata: Value) -> Vec<String> {
    let spec = spec.as_object().cloned().unwrap_or_default();
    let pod = Pod {
        spec: &spec,
        metadata: &metadata,
        at: "spec",
    };
    check(&pod)
        .into_iter()
        .map(|v| format!("{} {}", v.field, v.detail))
        .collect()
}

fn fields(check: Check, spec: Value) -> Vec<String> {
    fields_with(check, spec, Value::Null)
}

/// A pod spec with one container `c` whose securityContext is `sc`.
fn with_sc(sc: Value) -> Value {
    json!({"containers": [{"name": "c", "image": "i", "securityContext": sc}]})
}

/// A container that passes every restricted check.
fn hardened() -> Value {
    json!({"name": "c", "image": "i", "securityContext": {"allowPrivilegeEscalation": false,
        "runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"},
        "capabilities": {"drop": ["ALL"]}}})
}

#[test]
fn host_namespaces_are_refused() {
    assert!(
        fields(
            host_namespaces,
            json!({"containers": [], "hostNetwork": false})
        )
        .is_empty()
    );
    assert_eq!(
        fields(
            host_namespaces,
            json!({"hostNetwork": true, "hostPID": true, "hostIPC": "yes"})
        ),
        [
            "spec.hostNetwork is true",
            "spec.hostPID is true",
            "spec.hostIPC is true"
        ]
    );
}

#[test]
fn privileged_containers_are_refused_in_every_list() {
    assert!(fields(privileged, with_sc(json!({"privileged": false}))).is_empty());
    let spec = json!({"containers": [{"name": "a"}],
        "initContainers": [{"name": "i", "securityContext": {"privileged": true}}],
        "ephemeralContainers": [{"name": "e", "securityContext": {"privileged": true}}]});
    assert_eq!(
        fields(privileged, spec),
        [
            "spec.initContainers[0].securityContext.privileged is true",
            "spec.ephemeralContainers[0].securityContext.privileged is true"
        ]
    );
}

#[test]
fn baseline_capabilities_are_the_published_list() {
    let add = |caps: Value| with_sc(json!({"capabilities": {"add": caps}}));
    assert!(
        fields(
            capabilities_baseline,
            add(json!(["CHOWN", "NET_BIND_SERVICE", "SYS_CHROOT"]))
        )
        .is_empty()
    );
    assert_eq!(
        fields(
            capabilities_baseline,
            add(json!(["SYS_ADMIN", "CHOWN", "net_admin"]))
        ),
        [
            "spec.containers[0].securityContext.capabilities.add adds \"SYS_ADMIN\"",
            "spec.containers[0].securityContext.capabilities.add adds \"net_admin\""
        ]
    );
    assert_eq!(
        fields(capabilities_baseline, add(json!("SYS_ADMIN"))).len(),
        1
    );
}

#[test]
fn host_path_volumes_are_refused() {
    let spec = json!({"volumes": [{"name": "data", "emptyDir": {}},
        {"name": "root", "hostPath": {"path": "/"}}]});
    assert_eq!(
        fields(host_path_volumes, spec),
        ["spec.volumes[1].hostPath is set (path \"/\")"]
    );
}

#[test]
fn host_ports_other_than_zero_are_refused() {
    let spec = json!({"containers": [{"name": "c", "ports": [
        {"containerPort": 80}, {"containerPort": 81, "hostPort": 0},
        {"containerPort": 82, "hostPort": 8080}]}]});
    assert_eq!(
        fields(host_ports, spec),
        ["spec.containers[0].ports[2].hostPort is 8080"]
    );
}

#[test]
fn app_armor_profiles_must_be_confined() {
    let ok = json!({"securityContext": {"appArmorProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "securityContext": {"appArmorProfile": {"type": "Localhost", "localhostProfile": "p"}}}]});
    assert!(fields(app_armor_profile, ok).is_empty());
    let bad =
        json!({"securityContext": {"appArmorProfile": {"type": "Unconfined"}}, "containers": []});
    assert_eq!(
        fields(app_armor_profile, bad),
        ["spec.securityContext.appArmorProfile.type is \"Unconfined\""]
    );
    let meta = json!({"annotations": {
        "container.apparmor.security.beta.kubernetes.io/a": "runtime/default",
        "container.apparmor.security.beta.kubernetes.io/b": "localhost/x",
        "container.apparmor.security.beta.kubernetes.io/c": "unconfined"}});
    assert_eq!(
        fields_with(app_armor_profile, json!({"containers": []}), meta),
        [
            "metadata.annotations[\"container.apparmor.security.beta.kubernetes.io/c\"] is \"unconfined\""
        ]
    );
}

#[test]
fn se_linux_options_allow_container_types_only() {
    let ok = with_sc(json!({"seLinuxOptions": {"type": "container_init_t", "level": "s0:c1"}}));
    assert!(fields(se_linux_options, ok).is_empty());
    let bad = json!({"securityContext": {"seLinuxOptions": {"type": "spc_t", "user": "system_u", "role": "r"}}});
    assert_eq!(
        fields(se_linux_options, bad),
        [
            "spec.securityContext.seLinuxOptions.type is \"spc_t\"",
            "spec.securityContext.seLinuxOptions.user is \"system_u\"",
            "spec.securityContext.seLinuxOptions.role is \"r\""
        ]
    );
}

#[test]
fn proc_mount_must_be_default() {
    assert!(fields(proc_mount, with_sc(json!({"procMount": "Default"}))).is_empty());
    assert_eq!(
        fields(proc_mount, with_sc(json!({"procMount": "Unmasked"}))),
        ["spec.containers[0].securityContext.procMount is \"Unmasked\""]
    );
}

#[test]
fn seccomp_baseline_refuses_unconfined() {
    assert!(
        fields(
            seccomp_profile_baseline,
            with_sc(json!({"seccompProfile": {"type": "RuntimeDefault"}}))
        )
        .is_empty()
    );
    assert!(
        fields(
            seccomp_profile_baseline,
            json!({"containers": [{"name": "c"}]})
        )
        .is_empty()
    );
    assert_eq!(
        fields(
            seccomp_profile_baseline,
            json!({"securityContext": {"seccompProfile": {"type": "Unconfined"}}})
        ),
        ["spec.securityContext.seccompProfile.type is \"Unconfined\""]
    );
}

#[test]
fn only_safe_sysctls() {
    let spec = json!({"securityContext": {"sysctls": [
        {"name": "net.ipv4.ip_local_port_range", "value": "1024 65535"},
        {"name": "kernel.msgmax", "value": "1"},
        {"name": "net.ipv4.tcp_keepalive_time", "value": "60"}]}});
    assert_eq!(
        fields(sysctls, spec),
        ["spec.securityContext.sysctls[1].name is \"kernel.msgmax\" (not a safe sysctl)"]
    );
}

#[test]
fn windows_host_process_is_refused() {
    let spec = json!({"securityContext": {"windowsOptions": {"hostProcess": true}},
        "containers": [{"name": "c", "securityContext": {"windowsOptions": {"hostProcess": false}}}]});
    assert_eq!(
        fields(windows_host_process, spec),
        ["spec.securityContext.windowsOptions.hostProcess is true"]
    );
}

#[test]
fn restricted_volumes_are_the_published_list() {
    let spec = json!({"volumes": [{"name": "a", "configMap": {"name": "x"}},
        {"name": "b", "csi": {"driver": "d"}}, {"name": "c", "nfs": {"server": "s", "path": "/"}},
        {"name": "d", "gitRepo": {"repository": "r"}}, {"name": "e", "projected": {"sources": []}}]});
    assert_eq!(
        fields(restricted_volumes, spec),
        [
            "spec.volumes[2].nfs is not a volume type restricted pods may use",
            "spec.volumes[3].gitRepo is not a volume type restricted pods may use"
        ]
    );
}

#[test]
fn allow_privilege_escalation_must_be_false() {
    assert!(
        fields(
            allow_privilege_escalation,
            with_sc(json!({"allowPrivilegeEscalation": false}))
        )
        .is_empty()
    );
    assert_eq!(
        fields(
            allow_privilege_escalation,
            json!({"containers": [{"name": "c"}]})
        ),
        ["spec.containers[0].securityContext.allowPrivilegeEscalation must be false"]
    );
    let windows = json!({"os": {"name": "windows"}, "containers": [{"name": "c"}]});
    assert!(fields(allow_privilege_escalation, windows).is_empty());
}

#[test]
fn run_as_non_root_on_the_pod_or_every_container() {
    let pod_level =
        json!({"securityContext": {"runAsNonRoot": true}, "containers": [{"name": "c"}]});
    assert!(fields(run_as_non_root, pod_level).is_empty());
    assert!(fields(run_as_non_root, with_sc(json!({"runAsNonRoot": true}))).is_empty());
    assert_eq!(
        fields(run_as_non_root, json!({"containers": [{"name": "c"}]})),
        ["spec.containers[0].securityContext.runAsNonRoot must be true (here or on the pod)"]
    );
    let overridden = json!({"securityContext": {"runAsNonRoot": true},
        "containers": [{"name": "c", "securityContext": {"runAsNonRoot": false}}]});
    assert_eq!(
        fields(run_as_non_root, overridden),
        ["spec.containers[0].securityContext.runAsNonRoot must not be false"]
    );
}

#[test]
fn run_as_user_must_not_be_root() {
    assert!(fields(run_as_user, with_sc(json!({"runAsUser": 1000}))).is_empty());
    let spec = json!({"securityContext": {"runAsUser": 0},
        "containers": [{"name": "c", "securityContext": {"runAsUser": 0}}]});
    assert_eq!(
        fields(run_as_user, spec),
        [
            "spec.securityContext.runAsUser is 0",
            "spec.containers[0].securityContext.runAsUser is 0"
        ]
    );
}

#[test]
fn seccomp_restricted_needs_a_profile() {
    let pod_level = json!({"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c"}]});
    assert!(fields(seccomp_profile_restricted, pod_level).is_empty());
    assert_eq!(
        fields(
            seccomp_profile_restricted,
            json!({"containers": [{"name": "c"}]})
        ),
        [
            "spec.containers[0].securityContext.seccompProfile.type must be RuntimeDefault or Localhost"
        ]
    );
    let unconfined = json!({"securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "c", "securityContext": {"seccompProfile": {"type": "Unconfined"}}}]});
    assert_eq!(fields(seccomp_profile_restricted, unconfined).len(), 1);
}

#[test]
fn capabilities_restricted_drop_all_add_bind_only() {
    let ok = with_sc(json!({"capabilities": {"drop": ["ALL"], "add": ["NET_BIND_SERVICE"]}}));
    assert!(fields(capabilities_restricted, ok).is_empty());
    let bad = with_sc(json!({"capabilities": {"drop": ["NET_RAW"], "add": ["CHOWN"]}}));
    assert_eq!(
        fields(capabilities_restricted, bad),
        [
            "spec.containers[0].securityContext.capabilities.drop must include \"ALL\"",
            "spec.containers[0].securityContext.capabilities.add adds \"CHOWN\""
        ]
    );
}

#[test]
fn levels_parse_and_choose_their_checks() {
    assert_eq!("Baseline".parse::<Level>(), Ok(Level::Baseline));
    assert_eq!("restricted".parse::<Level>(), Ok(Level::Restricted));
    assert_eq!("privileged".parse::<Level>(), Ok(Level::Privileged));
    assert!("strict".parse::<Level>().is_err());
    assert_eq!(Level::default(), Level::Baseline);
    let root = json!({"kind": "Pod", "spec": {"containers": [{"name": "c", "securityContext": {"runAsUser": 0}}]}});
    assert!(violations(Level::Baseline, &root).unwrap().is_empty());
    let restricted: Vec<&str> = violations(Level::Restricted, &root)
        .unwrap()
        .iter()
        .map(|v| v.check)
        .collect::<Vec<_>>()
        .into_iter()
        .collect();
    assert!(restricted.contains(&"runAsUser"), "{restricted:?}");
    let hardened_pod = json!({"spec": {"securityContext": {"runAsNonRoot": true}, "containers": [hardened()],
        "volumes": [{"name": "v", "emptyDir": {}}]}});
    assert!(
        violations(Level::Restricted, &hardened_pod)
            .unwrap()
            .is_empty()
    );
    let privileged = json!({"spec": {"hostPID": true, "containers": [{"name": "c", "securityContext": {"privileged": true}}]}});
    assert!(
        violations(Level::Privileged, &privileged)
            .unwrap()
            .is_empty()
    );
    assert_eq!(violations(Level::Baseline, &privileged).unwrap().len(), 2);
}

#[test]
fn pod_specs_are_found_wherever_they_sit() {
    let bad = json!({"containers": [{"name": "c", "securityContext": {"privileged": true}}]});
    for (obj, field) in [
        (
            json!({"kind": "Pod", "spec": bad}),
            "spec.containers[0].securityContext.privileged",
        ),
        (
            json!({"kind": "Deployment", "spec": {"template": {"spec": bad}}}),
            "spec.template.spec.containers[0].securityContext.privileged",
        ),
        (
            json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": bad}}}}}),
            "spec.jobTemplate.spec.template.spec.containers[0].securityContext.privileged",
        ),
        (
            json!({"kind": "Thing", "spec": {"pods": [{"podSpec": bad}]}}),
            "spec.pods[0].podSpec.containers[0].securityContext.privileged",
        ),
    ] {
        let found = violations(Level::Baseline, &obj).unwrap();
        assert_eq!(found.len(), 1, "{obj}");
        assert_eq!(found[0].field, field);
        assert_eq!(found[0].check, "privileged");
    }
    // A template's own annotations are its pod's.
    let annotated = json!({"spec": {"template": {
        "metadata": {"annotations": {"container.apparmor.security.beta.kubernetes.io/c": "unconfined"}},
        "spec": {"containers": [{"name": "c"}]}}}});
    let found = violations(Level::Baseline, &annotated).unwrap();
    assert_eq!(
        found[0].field,
        "spec.template.metadata.annotations[\"container.apparmor.security.beta.kubernetes.io/c\"]"
    );
    let mut deep = json!({"containers": [{"securityContext": {"privileged": true}}]});
    for _ in 0..(MAX_DEPTH + 2) {
        deep = json!({"a": deep});
    }
    assert!(violations(Level::Baseline, &deep).is_err());
}

#[test]
fn what_the_object_already_has_is_not_new() {
    let spec = |sc: Value| json!({"containers": [{"name": "web", "securityContext": sc}]});
    let owner = json!({"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec":
        spec(json!({"privileged": true}))}}}}});
    let copy =
        json!({"kind": "Job", "spec": {"template": {"spec": spec(json!({"privileged": true}))}}});
    assert_eq!(check(Level::Baseline, &copy, Some(&owner)), Ok(()));
    let more = json!({"kind": "Job", "spec": {"template": {"spec": {"hostPID": true,
        "containers": [{"name": "web", "securityContext": {"privileged": true}}]}}}});
    assert_eq!(
        check(Level::Baseline, &more, Some(&owner)),
        Err(
            "pod security \"baseline\": spec.template.spec.hostPID is true (check hostNamespaces)"
                .into()
        )
    );
    // Another container is another place.
    let other = json!({"kind": "Job", "spec": {"template": {"spec": {
        "containers": [{"name": "sh", "securityContext": {"privileged": true}}]}}}});
    assert!(check(Level::Baseline, &other, Some(&owner)).is_err());
    // A different value at the same place is new.
    let before = json!({"spec": {"containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}]}});
    let after = json!({"spec": {"containers": [{"name": "c", "securityContext": {"capabilities": {"add": ["NET_ADMIN", "SYS_ADMIN"]}}}]}});
    let found = new_violations(Level::Baseline, &after, Some(&before)).unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].detail, "adds \"SYS_ADMIN\"");
    assert!(
        check(Level::Baseline, &after, None)
            .unwrap_err()
            .contains("NET_ADMIN")
    );
}

#[test]
fn refusals_name_the_level_the_field_and_the_check() {
    let pod =
        json!({"spec": {"containers": [{"name": "c", "securityContext": {"privileged": true}}]}});
    assert_eq!(
        check(Level::Baseline, &pod, None),
        Err("pod security \"baseline\": spec.containers[0].securityContext.privileged is true (check privileged)".into())
    );
    let many: Vec<Value> = (0..10)
        .map(|i| json!({"name": format!("c{i}"), "securityContext": {"privileged": true}}))
        .collect();
    let msg = check(
        Level::Baseline,
        &json!({"spec": {"containers": many}}),
        None,
    )
    .unwrap_err();
    assert!(msg.ends_with("; and 2 more"), "{msg}");
}
