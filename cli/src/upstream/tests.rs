use super::*;

/// Upstream's flags and their environment variables, as registered in
/// cmd/argocd-agent/principal.go of argoproj-labs/argocd-agent at commit
/// acb60cd106da91eb5e1212e02a3fde4bc9a92f17. A flag upstream adds must be added here and to
/// [`SETTINGS`] (accepted, translated or refused), or this test fails.
const UPSTREAM_PRINCIPAL: &[(&str, &str)] = &[
    ("listen-host", "ARGOCD_PRINCIPAL_LISTEN_HOST"),
    ("listen-port", "ARGOCD_PRINCIPAL_LISTEN_PORT"),
    ("log-level", "ARGOCD_PRINCIPAL_LOG_LEVEL"),
    ("log-format", "ARGOCD_PRINCIPAL_LOG_FORMAT"),
    ("full-detail", "ARGOCD_PRINCIPAL_FULL_DETAIL"),
    ("metrics-port", "ARGOCD_PRINCIPAL_METRICS_PORT"),
    ("namespace", "ARGOCD_PRINCIPAL_NAMESPACE"),
    ("allowed-namespaces", "ARGOCD_PRINCIPAL_ALLOWED_NAMESPACES"),
    (
        "namespace-create-enable",
        "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_ENABLE",
    ),
    (
        "namespace-create-pattern",
        "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_PATTERN",
    ),
    (
        "namespace-create-labels",
        "ARGOCD_PRINCIPAL_NAMESPACE_CREATE_LABELS",
    ),
    ("tls-secret-name", "ARGOCD_PRINCIPAL_TLS_SECRET_NAME"),
    ("tls-cert", "ARGOCD_PRINCIPAL_TLS_SERVER_CERT_PATH"),
    ("tls-key", "ARGOCD_PRINCIPAL_TLS_SERVER_KEY_PATH"),
    (
        "insecure-tls-generate",
        "ARGOCD_PRINCIPAL_TLS_SERVER_ALLOW_GENERATE",
    ),
    ("insecure-plaintext", "ARGOCD_PRINCIPAL_INSECURE_PLAINTEXT"),
    (
        "tls-ca-secret-name",
        "ARGOCD_PRINCIPAL_TLS_SERVER_ROOT_CA_SECRET_NAME",
    ),
    ("root-ca-path", "ARGOCD_PRINCIPAL_TLS_SERVER_ROOT_CA_PATH"),
    (
        "require-client-certs",
        "ARGOCD_PRINCIPAL_TLS_CLIENT_CERT_REQUIRE",
    ),
    (
        "client-cert-subject-match",
        "ARGOCD_PRINCIPAL_TLS_CLIENT_CERT_MATCH_SUBJECT",
    ),
    ("tls-min-version", "ARGOCD_PRINCIPAL_TLS_MIN_VERSION"),
    ("tls-max-version", "ARGOCD_PRINCIPAL_TLS_MAX_VERSION"),
    ("tls-ciphersuites", "ARGOCD_PRINCIPAL_TLS_CIPHERSUITES"),
    (
        "resource-proxy-secret-name",
        "ARGOCD_PRINCIPAL_RESOURCE_PROXY_SECRET_NAME",
    ),
    (
        "resource-proxy-cert-path",
        "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CERT_PATH",
    ),
    (
        "resource-proxy-key-path",
        "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_KEY_PATH",
    ),
    (
        "resource-proxy-ca-secret-name",
        "ARGOCD_PRINCIPAL_RESOURCE_PROXY_CA_SECRET_NAME",
    ),
    (
        "resource-proxy-ca-path",
        "ARGOCD_PRINCIPAL_RESOURCE_PROXY_TLS_CA_PATH",
    ),
    ("jwt-secret-name", "ARGOCD_PRINCIPAL_JWT_SECRET_NAME"),
    ("jwt-key", "ARGOCD_PRINCIPAL_JWT_KEY_PATH"),
    (
        "insecure-jwt-generate",
        "ARGOCD_PRINCIPAL_JWT_ALLOW_GENERATE",
    ),
    ("auth", "ARGOCD_PRINCIPAL_AUTH"),
    ("enable-websocket", "ARGOCD_PRINCIPAL_ENABLE_WEBSOCKET"),
    (
        "enable-resource-proxy",
        "ARGOCD_PRINCIPAL_ENABLE_RESOURCE_PROXY",
    ),
    (
        "resource-proxy-address",
        "ARGOCD_PRINCIPAL_RESOURCE_PROXY_ADDRESS",
    ),
    (
        "keepalive-min-interval",
        "ARGOCD_PRINCIPAL_KEEP_ALIVE_MIN_INTERVAL",
    ),
    (
        "redis-server-address",
        "ARGOCD_PRINCIPAL_REDIS_SERVER_ADDRESS",
    ),
    ("redis-password", "REDIS_PASSWORD"),
    ("redis-creds-dir-path", "REDIS_CREDS_DIR_PATH"),
    (
        "disable-redis-proxy",
        "ARGOCD_PRINCIPAL_DISABLE_REDIS_PROXY",
    ),
    (
        "redis-compression-type",
        "ARGOCD_PRINCIPAL_REDIS_COMPRESSION_TYPE",
    ),
    ("pprof-port", "ARGOCD_PRINCIPAL_PPROF_PORT"),
    ("healthz-port", "ARGOCD_PRINCIPAL_HEALTH_CHECK_PORT"),
    (
        "grpc-max-message-size",
        "ARGOCD_PRINCIPAL_GRPC_MAX_MESSAGE_SIZE",
    ),
    ("event-processors", "ARGOCD_PRINCIPAL_EVENT_PROCESSORS"),
    ("otlp-address", "ARGOCD_PRINCIPAL_OTLP_ADDRESS"),
    ("otlp-insecure", "ARGOCD_PRINCIPAL_OTLP_INSECURE"),
    ("redis-tls-enabled", "ARGOCD_PRINCIPAL_REDIS_TLS_ENABLED"),
    (
        "redis-proxy-server-tls-cert",
        "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_CERT_PATH",
    ),
    (
        "redis-proxy-server-tls-key",
        "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_KEY_PATH",
    ),
    (
        "redis-proxy-server-tls-secret-name",
        "ARGOCD_PRINCIPAL_REDIS_PROXY_SERVER_TLS_SECRET_NAME",
    ),
    ("redis-ca-path", "ARGOCD_PRINCIPAL_REDIS_CA_PATH"),
    (
        "redis-ca-secret-name",
        "ARGOCD_PRINCIPAL_REDIS_CA_SECRET_NAME",
    ),
    ("redis-tls-insecure", "ARGOCD_PRINCIPAL_REDIS_TLS_INSECURE"),
    (
        "destination-based-mapping",
        "ARGOCD_PRINCIPAL_DESTINATION_BASED_MAPPING",
    ),
    ("label-selector", "ARGOCD_PRINCIPAL_LABEL_SELECTOR"),
    ("kubeconfig", ""),
    ("kubecontext", ""),
    (
        "enable-self-cluster-registration",
        "ARGOCD_PRINCIPAL_ENABLE_SELF_CLUSTER_REGISTRATION",
    ),
    (
        "self-registration-client-cert-secret",
        "ARGOCD_PRINCIPAL_SELF_REGISTRATION_CLIENT_CERT_SECRET",
    ),
    ("ha-enabled", "ARGOCD_PRINCIPAL_HA_ENABLED"),
    ("ha-preferred-role", "ARGOCD_PRINCIPAL_HA_PREFERRED_ROLE"),
    ("ha-peer-address", "ARGOCD_PRINCIPAL_HA_PEER_ADDRESS"),
    (
        "ha-failover-timeout",
        "ARGOCD_PRINCIPAL_HA_FAILOVER_TIMEOUT",
    ),
    ("ha-admin-port", "ARGOCD_PRINCIPAL_HA_ADMIN_PORT"),
    (
        "ha-allowed-replication-clients",
        "ARGOCD_PRINCIPAL_HA_ALLOWED_REPLICATION_CLIENTS",
    ),
    (
        "ha-replication-initial-ack-timeout",
        "ARGOCD_PRINCIPAL_HA_REPLICATION_INITIAL_ACK_TIMEOUT",
    ),
];

/// Upstream's agent flags (cmd/argocd-agent/agent.go, same commit).
const UPSTREAM_AGENT: &[(&str, &str)] = &[
    ("server-address", "ARGOCD_AGENT_REMOTE_SERVER"),
    ("server-port", "ARGOCD_AGENT_REMOTE_PORT"),
    ("log-level", "ARGOCD_AGENT_LOG_LEVEL"),
    ("full-detail", "ARGOCD_AGENT_FULL_DETAIL"),
    ("redis-addr", "REDIS_ADDR"),
    ("redis-creds-dir-path", "REDIS_CREDS_DIR_PATH"),
    ("redis-username", "REDIS_USERNAME"),
    ("redis-password", "REDIS_PASSWORD"),
    ("redis-tls-enabled", "ARGOCD_AGENT_REDIS_TLS_ENABLED"),
    ("redis-tls-ca-path", "ARGOCD_AGENT_REDIS_TLS_CA_PATH"),
    (
        "redis-tls-ca-secret-name",
        "ARGOCD_AGENT_REDIS_TLS_CA_SECRET_NAME",
    ),
    ("redis-tls-insecure", "ARGOCD_AGENT_REDIS_TLS_INSECURE"),
    ("log-format", "ARGOCD_AGENT_LOG_FORMAT"),
    ("insecure-tls", "ARGOCD_AGENT_TLS_INSECURE"),
    ("insecure-plaintext", "ARGOCD_AGENT_INSECURE_PLAINTEXT"),
    ("namespace", "ARGOCD_AGENT_NAMESPACE"),
    ("agent-mode", "ARGOCD_AGENT_MODE"),
    ("creds", "ARGOCD_AGENT_CREDS"),
    (
        "root-ca-secret-name",
        "ARGOCD_AGENT_TLS_ROOT_CA_SECRET_NAME",
    ),
    ("root-ca-path", "ARGOCD_AGENT_TLS_ROOT_CA_PATH"),
    ("tls-secret-name", "ARGOCD_AGENT_TLS_SECRET_NAME"),
    ("tls-client-cert", "ARGOCD_AGENT_TLS_CLIENT_CERT_PATH"),
    ("tls-client-key", "ARGOCD_AGENT_TLS_CLIENT_KEY_PATH"),
    ("tls-min-version", "ARGOCD_AGENT_TLS_MIN_VERSION"),
    ("tls-max-version", "ARGOCD_AGENT_TLS_MAX_VERSION"),
    ("tls-ciphersuites", "ARGOCD_AGENT_TLS_CIPHERSUITES"),
    ("enable-websocket", "ARGOCD_AGENT_ENABLE_WEBSOCKET"),
    ("metrics-port", "ARGOCD_AGENT_METRICS_PORT"),
    ("healthz-port", "ARGOCD_AGENT_HEALTH_CHECK_PORT"),
    (
        "keep-alive-ping-interval",
        "ARGOCD_AGENT_KEEP_ALIVE_PING_INTERVAL",
    ),
    ("enable-compression", "ARGOCD_AGENT_ENABLE_COMPRESSION"),
    ("pprof-port", "ARGOCD_AGENT_PPROF_PORT"),
    (
        "enable-resource-proxy",
        "ARGOCD_AGENT_ENABLE_RESOURCE_PROXY",
    ),
    (
        "cache-refresh-interval",
        "ARGOCD_AGENT_CACHE_REFRESH_INTERVAL",
    ),
    (
        "informer-sync-timeout",
        "ARGOCD_AGENT_INFORMER_SYNC_TIMEOUT",
    ),
    (
        "buffer-informer-event-interval",
        "ARGOCD_AGENT_BUFFER_INFORMER_EVENT_INTERVAL",
    ),
    ("heartbeat-interval", "ARGOCD_AGENT_HEARTBEAT_INTERVAL"),
    (
        "grpc-max-message-size",
        "ARGOCD_AGENT_GRPC_MAX_MESSAGE_SIZE",
    ),
    ("otlp-address", "ARGOCD_AGENT_OTLP_ADDRESS"),
    ("otlp-insecure", "ARGOCD_AGENT_OTLP_INSECURE"),
    (
        "destination-based-mapping",
        "ARGOCD_AGENT_DESTINATION_BASED_MAPPING",
    ),
    ("create-namespace", "ARGOCD_AGENT_CREATE_NAMESPACE"),
    (
        "ignore-unmanaged-apps",
        "ARGOCD_AGENT_IGNORE_UNMANAGED_APPS",
    ),
    (
        "source-uid-mismatch-policy",
        "ARGOCD_AGENT_SOURCE_UID_MISMATCH_POLICY",
    ),
    (
        "on-application-recreate",
        "ARGOCD_AGENT_ON_APPLICATION_RECREATE",
    ),
    ("allowed-namespaces", "ARGOCD_AGENT_ALLOWED_NAMESPACES"),
    ("label-selector", "ARGOCD_AGENT_LABEL_SELECTOR"),
    ("adoption-policy", "ARGOCD_AGENT_ADOPTION_POLICY"),
    ("kubeconfig", ""),
    ("kubecontext", ""),
];

fn upstream(role: Role) -> &'static [(&'static str, &'static str)] {
    match role {
        Role::Principal => UPSTREAM_PRINCIPAL,
        Role::Agent => UPSTREAM_AGENT,
    }
}

fn no_env(_: &str) -> Option<String> {
    None
}

fn argv(role: Role, args: &[&str]) -> Vec<String> {
    let mut v = vec!["argocd-agent".to_string(), role.name().to_string()];
    if role == Role::Agent {
        v.extend(["--server-address".into(), "p".into()]);
    }
    v.extend(args.iter().map(|s| s.to_string()));
    v
}

fn parse(role: Role, args: &[&str]) -> Result<Parsed, ParseError> {
    try_parse_from(argv(role, args), &no_env)
}

fn principal(args: &[&str]) -> (PrincipalArgs, Vec<String>) {
    match parse(Role::Principal, args) {
        Ok(Parsed {
            cli: Cli {
                command: Command::Principal(p),
            },
            notices,
        }) => (*p, notices),
        other => panic!("{args:?}: {other:?}"),
    }
}

fn agent(args: &[&str]) -> (AgentArgs, Vec<String>) {
    match parse(Role::Agent, args) {
        Ok(Parsed {
            cli: Cli {
                command: Command::Agent(a),
            },
            notices,
        }) => (*a, notices),
        other => panic!("{args:?}: {other:?}"),
    }
}

fn refused(role: Role, args: &[&str]) -> Vec<String> {
    match parse(role, args) {
        Err(ParseError::Refused(list)) => list,
        other => panic!("{args:?} should be refused: {other:?}"),
    }
}

#[test]
fn the_table_is_upstreams_flag_list_exactly() {
    for role in [Role::Principal, Role::Agent] {
        let table: Vec<(&str, &str)> = SETTINGS
            .iter()
            .filter(|s| s.role == role)
            .map(|s| (s.flag, s.env.unwrap_or("")))
            .collect();
        for (flag, env) in upstream(role) {
            let n = table.iter().filter(|(f, _)| f == flag).count();
            assert_eq!(n, 1, "{} --{flag}: {n} rows in SETTINGS", role.name());
            assert!(
                table.contains(&(flag, env)),
                "{} --{flag}: env should be {env:?}",
                role.name()
            );
        }
        for (flag, _) in &table {
            assert!(
                upstream(role).iter().any(|(f, _)| f == flag),
                "{} --{flag} is not an upstream flag",
                role.name()
            );
        }
    }
}

#[test]
fn same_and_alias_rows_name_our_real_flags() {
    let cmd = Cli::command();
    for s in SETTINGS {
        let (Same(id) | Alias(id)) = s.ours else {
            continue;
        };
        let sub = cmd.find_subcommand(s.role.name()).unwrap();
        let arg = sub
            .get_arguments()
            .find(|a| a.get_id() == id)
            .unwrap_or_else(|| panic!("{}: no flag {id}", s.flag));
        let our_env = arg.get_env().and_then(|e| e.to_str());
        let same = arg.get_long() == Some(s.flag) && our_env == s.env;
        assert_eq!(
            matches!(s.ours, Same(_)),
            same,
            "{} --{}: ours is --{:?} env {our_env:?}: Same only when flag and env are upstream's",
            s.role.name(),
            s.flag,
            arg.get_long()
        );
    }
}

#[test]
fn every_upstream_flag_is_recognised_never_unknown() {
    for s in SETTINGS {
        let value = if s.boolean() {
            "true".to_string()
        } else {
            format!("{}-not-the-default", s.default)
        };
        let flag = format!("--{}={value}", s.flag);
        match parse(s.role, &[&flag]) {
            Ok(_) => assert!(!matches!(s.ours, Refused(_)), "{flag} should be refused"),
            Err(ParseError::Refused(list)) => assert!(
                list.iter()
                    .any(|m| m.contains(&format!("--{}", s.flag)) && m.contains(SEE)),
                "{flag}: {list:?}"
            ),
            Err(ParseError::Clap(e)) => assert!(
                !matches!(
                    e.kind(),
                    clap::error::ErrorKind::UnknownArgument
                        | clap::error::ErrorKind::NoEquals
                        | clap::error::ErrorKind::TooManyValues
                ),
                "{flag}: {e}"
            ),
        }
    }
}

#[test]
fn refused_settings_at_upstream_default_are_accepted_with_a_warning() {
    let (_, notices) = principal(&[
        "--tls-secret-name=argocd-agent-principal-tls",
        "--insecure-tls-generate=false",
        "--jwt-key=",
    ]);
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(notices[0].contains("--tls-secret-name") && notices[0].contains("SPIFFE"));
    let list = refused(
        Role::Principal,
        &[
            "--tls-secret-name=mine",
            "--insecure-tls-generate",
            "--ha-enabled=true",
            "--tls-ciphersuites=list",
        ],
    );
    assert_eq!(list.len(), 4, "every refusal at once: {list:?}");
    assert!(list[0].starts_with("--tls-secret-name=mine: TLS comes from SPIFFE X.509-SVIDs"));
    assert!(
        list.iter()
            .any(|m| m.contains("--ha-enabled") && m.contains("Leases"))
    );
    assert!(
        list.iter()
            .any(|m| m.contains("\"list\" is not offered here")),
        "{list:?}"
    );
    let (_, notices) = principal(&["--event-processors", "20", "--require-client-certs"]);
    assert_eq!(notices.len(), 2, "not needed, said so: {notices:?}");
}

#[test]
fn upstream_tls_versions_and_suites_are_honoured_and_old_versions_refused() {
    use argocd_agent_identity::tls::TlsVersion::{Tls12, Tls13};
    let range = |args: &[&str]| {
        let (p, notices) = principal(args);
        assert!(notices.is_empty(), "{notices:?}");
        let profile = p.tls.profile().expect("a valid profile");
        (profile.min(), profile.max())
    };
    assert_eq!(range(&[]), (Tls13, Tls13), "TLS 1.3 only by default");
    assert_eq!(range(&["--tls-min-version=tls1.3"]), (Tls13, Tls13));
    assert_eq!(range(&["--tls-min-version", "tls1.2"]), (Tls12, Tls13));
    assert_eq!(
        range(&["--tls-min-version=tls1.2", "--tls-max-version=tls1.2"]),
        (Tls12, Tls12)
    );
    let (p, _) = principal(&[
        "--tls-min-version=tls1.2",
        "--tls-ciphersuites",
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256",
    ]);
    assert_eq!(p.tls.tls_ciphersuites.len(), 2);
    p.tls.profile().expect("both suites allowed");
    let (a, _) = agent(&["--tls-min-version", "tls1.2"]);
    assert_eq!(a.tls.profile().unwrap().min(), Tls12);
    for role in [Role::Principal, Role::Agent] {
        let m = refused(role, &["--tls-min-version=tls1.1"]);
        assert_eq!(m.len(), 1, "{m:?}");
        assert!(m[0].contains("TLS 1.1 and older are not offered"), "{m:?}");
        let m = refused(
            role,
            &["--tls-min-version=tls1.3", "--tls-max-version=tls1.2"],
        );
        assert!(m[0].contains("cannot be higher"), "{m:?}");
    }
    // Upstream's variables (the params keys of its Deployments) are read too.
    let env = |k: &str| {
        k.ends_with("_TLS_MIN_VERSION")
            .then(|| "tls1.2".to_string())
    };
    let cmd = command(&env);
    for (role, var) in [
        (Role::Principal, "ARGOCD_PRINCIPAL_TLS_MIN_VERSION"),
        (Role::Agent, "ARGOCD_AGENT_TLS_MIN_VERSION"),
    ] {
        let sub = cmd.find_subcommand(role.name()).unwrap();
        let arg = sub
            .get_arguments()
            .find(|a| a.get_id() == "tls_min_version")
            .unwrap();
        assert_eq!(arg.get_env().and_then(|e| e.to_str()), Some(var));
    }
}

#[test]
fn principal_aliases_and_translations() {
    let (p, _) = principal(&[
        "--namespace-create-labels",
        "a=b,c=d",
        "--root-ca-path",
        "/ca.pem",
        "--tls-cert",
        "/c.pem",
        "--tls-key",
        "/k.pem",
        "--grpc-max-message-size",
        "1000",
        "--kubecontext",
        "hub",
        "-n",
        "gitops",
        "--enable-resource-proxy=false",
        "--keepalive-min-interval",
        "1m30s",
    ]);
    assert_eq!(p.namespace_create_label, ["a=b", "c=d"]);
    assert_eq!(p.svid.root_ca, ["/ca.pem"]);
    assert_eq!(p.max_message_size, 1000);
    assert_eq!(p.kube.kube_context.as_deref(), Some("hub"));
    assert_eq!(p.namespace, "gitops");
    assert!(!p.resource_proxy.enable_resource_proxy);
    assert_eq!(p.keepalive_min_interval, Duration::from_secs(90));
    let (p, _) = principal(&["--enable-resource-proxy"]);
    assert!(p.resource_proxy.enable_resource_proxy);

    let m = refused(Role::Principal, &["--auth", "userpass:/app/creds"]);
    assert!(m[0].contains("no agent passwords"), "{m:?}");
    let m = refused(Role::Principal, &["--auth", "mtls:CN=([^,]+)"]);
    assert!(m[0].contains("mtls:uri:"), "{m:?}");
    principal(&["--auth", "mtls:uri:spiffe://example.org/agent/(.+)"]);
    let m = refused(Role::Principal, &["--insecure-plaintext"]);
    assert!(m[0].contains("header auth"), "{m:?}");
    principal(&["--insecure-plaintext", "--auth", "header:istio"]);
}

#[test]
fn principal_redis_tls_needs_paths_and_is_off_unless_enabled() {
    let paths = [
        "--redis-proxy-server-tls-cert=/t/tls.crt",
        "--redis-proxy-server-tls-key=/t/tls.key",
        "--redis-ca-path=/r/ca.crt",
    ];
    let (p, _) = principal(&paths);
    assert_eq!(p.redis.redis_proxy_tls_cert_path, None, "TLS off: not read");
    assert_eq!(p.redis.redis_server_tls_ca_path, None);
    let mut on = vec!["--redis-tls-enabled"];
    on.extend(paths);
    let (p, _) = principal(&on);
    assert_eq!(
        p.redis.redis_proxy_tls_cert_path,
        Some(PathBuf::from("/t/tls.crt"))
    );
    assert_eq!(
        p.redis.redis_proxy_tls_key_path,
        Some(PathBuf::from("/t/tls.key"))
    );
    assert_eq!(
        p.redis.redis_server_tls_ca_path,
        Some(PathBuf::from("/r/ca.crt"))
    );
    let m = refused(Role::Principal, &["--redis-tls-enabled=true"]);
    assert_eq!(m.len(), 2, "{m:?}");
    assert!(
        m[0].contains("--redis-proxy-tls-cert-path") && m[1].contains("--redis-server-tls-ca-path")
    );
}

#[test]
fn agent_aliases_and_translations() {
    let (a, notices) = agent(&[
        "--creds",
        "mtls:any",
        "--tls-client-cert",
        "/c.pem",
        "--tls-client-key",
        "/k.pem",
        "--root-ca-path",
        "/ca.pem",
        "--enable-resource-proxy=false",
        "--keep-alive-ping-interval",
        "0",
        "--heartbeat-interval",
        "0",
        "--redis-tls-enabled=false",
        "--redis-tls-ca-path",
        "/app/config/redis-tls/ca.crt",
        "--tls-min-version=tls1.2",
        // The agent refuses to connect to an unpinned principal (upstream's mtls:any does not
        // pin one).
        "--principal-trust-domain",
        "example.org",
    ]);
    assert_eq!(a.creds, "spiffe");
    assert_eq!(a.svid.tls_cert, Some(PathBuf::from("/c.pem")));
    assert_eq!(a.svid.root_ca, ["/ca.pem"]);
    assert!(a.resource_proxy.disable_resource_proxy);
    assert_eq!(a.keep_alive_ping_interval, Duration::from_secs(30));
    assert_eq!(a.heartbeat_interval, None);
    assert_eq!(
        a.redis.redis_tls_ca_path, None,
        "upstream: no CA read with TLS off"
    );
    assert_eq!(notices.len(), 2, "{notices:?}");
    a.config().expect("a valid agent configuration");

    let (a, _) = agent(&["--redis-tls-ca-path", "/ca.crt"]);
    assert!(
        a.redis.redis_tls_ca_path.is_some(),
        "ours: a CA turns TLS on"
    );
    let m = refused(Role::Agent, &["--redis-tls-enabled"]);
    assert!(m[0].contains("--redis-tls-ca-path"), "{m:?}");
    let m = refused(
        Role::Agent,
        &["--creds", "userpass:/app/config/creds/userpass.creds"],
    );
    assert!(m[0].contains("no agent passwords"), "{m:?}");
    let m = refused(
        Role::Agent,
        &["--insecure-tls", "--tls-min-version", "tls1.3"],
    );
    assert_eq!(m.len(), 1, "{m:?}");
    let m = refused(Role::Agent, &["--insecure-plaintext"]);
    assert!(m[0].contains("--creds header:"), "{m:?}");
    agent(&["--insecure-plaintext", "--creds", "header:"]);
}

#[test]
fn upstream_env_names_are_read_when_ours_are_unset() {
    let env = |k: &str| {
        match k {
            "ARGOCD_AGENT_GRPC_MAX_MESSAGE_SIZE" => Some("1000"),
            "REDIS_ADDR" => Some("argocd-redis:6379"),
            // Both set: ours wins.
            "REDIS_PASSWORD" => Some("theirs"),
            "ARGOCD_AGENT_REDIS_PASSWORD" => Some("ours"),
            "ARGOCD_AGENT_TLS_SECRET_NAME" => Some("argocd-agent-client-tls"),
            // Upstream's manifests leave keys empty: unset.
            "ARGOCD_AGENT_LABEL_SELECTOR" => Some(""),
            _ => None,
        }
        .map(str::to_string)
    };
    let cmd = command(&env);
    let sub = cmd.find_subcommand("agent").unwrap();
    let env_of = |id: &str| {
        sub.get_arguments()
            .find(|a| a.get_id() == id)
            .and_then(|a| a.get_env())
            .and_then(|e| e.to_str())
            .map(str::to_string)
    };
    assert_eq!(
        env_of("max_message_size").as_deref(),
        Some("ARGOCD_AGENT_GRPC_MAX_MESSAGE_SIZE")
    );
    assert_eq!(env_of("redis_addr").as_deref(), Some("REDIS_ADDR"));
    assert_eq!(
        env_of("redis_password").as_deref(),
        Some("ARGOCD_AGENT_REDIS_PASSWORD")
    );
    assert_eq!(env_of("label_selector"), None);
    assert_eq!(
        env_of("tls-secret-name").as_deref(),
        Some("ARGOCD_AGENT_TLS_SECRET_NAME")
    );
    assert_eq!(
        env_of("tls-client-cert"),
        None,
        "not a hidden flag: an alias"
    );
    assert_eq!(
        env_of("tls_cert"),
        None,
        "unset upstream variable: no change"
    );
}

#[test]
fn the_migration_doc_lists_every_upstream_flag() {
    let doc = include_str!("../../../docs/migration.md");
    let section = doc
        .split("## Configuration")
        .nth(1)
        .expect("docs/migration.md has a Configuration section");
    let section = section.split("\n## ").next().unwrap_or(section);
    for (role, heading) in [
        (Role::Principal, "### Principal"),
        (Role::Agent, "### Agent"),
    ] {
        let part = section
            .split(heading)
            .nth(1)
            .unwrap_or_else(|| panic!("no {heading}"))
            .split("\n### ")
            .next()
            .unwrap();
        for (flag, env) in upstream(role) {
            assert!(
                part.contains(&format!("`--{flag}`")),
                "{heading}: no row for --{flag}"
            );
            assert!(env.is_empty() || part.contains(env), "{heading}: no {env}");
        }
    }
}

#[test]
fn durations_in_go_notation() {
    use crate::args::parse_duration as d;
    assert_eq!(d("0"), Ok(Duration::ZERO));
    assert_eq!(d("30"), Ok(Duration::from_secs(30)));
    assert_eq!(d("500ms"), Ok(Duration::from_millis(500)));
    assert_eq!(d("1h20m10s"), Ok(Duration::from_secs(4810)));
    assert!(d("").is_err());
    assert!(d("5x").is_err());
    assert!(d("1.5s").is_err());
    assert!(d("m").is_err());
}

#[test]
fn every_boolean_flag_takes_false_and_true() {
    let cmd = <Cli as clap::CommandFactory>::command();
    let mut checked = 0;
    for role in ["principal", "agent"] {
        let sub = cmd.find_subcommand(role).expect("subcommand");
        let switches: Vec<String> = sub
            .get_arguments()
            .filter(|a| matches!(a.get_action(), ArgAction::SetTrue))
            .filter_map(|a| a.get_long().map(str::to_owned))
            .collect();
        assert!(switches.len() > 5, "{role}: {switches:?}");
        for long in switches {
            for (value, expect) in [("=false", false), ("=true", true), ("", true)] {
                let flag = format!("--{long}{value}");
                let mut argv = vec!["argocd-agent", role, flag.as_str()];
                if role == "agent" {
                    argv.extend(["--server-address", "hub"]);
                }
                let parsed = try_parse_from(argv.clone(), &|_: &str| None);
                let matches = command(&|_: &str| None)
                    .try_get_matches_from(argv.clone())
                    .unwrap_or_else(|e| panic!("{argv:?}: {e}"));
                let (_, sub) = matches.subcommand().expect("a subcommand");
                let id = sub_id(&cmd, role, &long);
                assert_eq!(sub.get_one::<bool>(&id).copied(), Some(expect), "{argv:?}");
                if let Err(ParseError::Clap(e)) = parsed {
                    panic!("{argv:?}: {e}");
                }
                checked += 1;
            }
        }
    }
    assert!(checked > 30, "{checked}");
}

/// The clap id of `--long` in `role`.
fn sub_id(cmd: &clap::Command, role: &str, long: &str) -> String {
    cmd.find_subcommand(role)
        .and_then(|s| s.get_arguments().find(|a| a.get_long() == Some(long)))
        .map(|a| a.get_id().to_string())
        .expect("the flag")
}
