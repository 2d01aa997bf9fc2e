//! The Workload API service as SPIRE's agent serves it, backed by the dev CAs.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use argocd_agent_proto::prost_types;
use argocd_agent_proto::workload::spiffe_workload_api_server::SpiffeWorkloadApi;
use argocd_agent_proto::workload::{
    JwtBundlesRequest, JwtBundlesResponse, Jwtsvid, JwtsvidRequest, JwtsvidResponse,
    ValidateJwtsvidRequest, ValidateJwtsvidResponse, X509BundlesRequest, X509BundlesResponse,
    X509svid, X509svidRequest, X509svidResponse,
};
use futures::Stream;
use tokio::sync::watch;
use tonic::transport::server::UdsConnectInfo;
use tonic::{Request, Response, Status};

use super::DevServerError;
use super::ca::{DevCa, IssuedSvid};
use super::registration::Registration;
use argocd_agent_identity::id::SpiffeId;
use argocd_agent_identity::jwt::JwtBundles;

/// The SVIDs of one rotation generation.
pub(crate) struct Issued {
    pub(crate) generation: u64,
    pub(crate) svids: BTreeMap<SpiffeId, IssuedSvid>,
}

/// State shared by every socket's service.
pub(crate) struct Shared {
    pub(crate) ca: Arc<DevCa>,
    pub(crate) federated: Vec<Arc<DevCa>>,
    pub(crate) registrations: Vec<Registration>,
    pub(crate) svid_ttl: Duration,
    pub(crate) jwt_ttl: Duration,
    pub(crate) issued: watch::Sender<Arc<Issued>>,
    pub(crate) shutdown: watch::Receiver<bool>,
}

impl Shared {
    /// Issues a fresh SVID for every registered ID.
    pub(crate) fn issue_all(
        ca: &DevCa,
        registrations: &[Registration],
        ttl: Duration,
        generation: u64,
    ) -> Result<Issued, DevServerError> {
        let mut svids = BTreeMap::new();
        for r in registrations {
            if !svids.contains_key(&r.spiffe_id) {
                svids.insert(r.spiffe_id.clone(), ca.issue_x509(&r.spiffe_id, ttl)?);
            }
        }
        Ok(Issued { generation, svids })
    }

    /// Re-issues every SVID and streams them to connected workloads.
    pub(crate) fn rotate(&self) -> Result<u64, DevServerError> {
        let generation = self.issued.borrow().generation + 1;
        let issued = Self::issue_all(&self.ca, &self.registrations, self.svid_ttl, generation)?;
        self.issued.send_replace(Arc::new(issued));
        tracing::info!(generation, "rotated development X.509-SVIDs");
        Ok(generation)
    }

    fn x509_bundles(&self) -> HashMap<String, Vec<u8>> {
        std::iter::once(&self.ca)
            .chain(self.federated.iter())
            .map(|ca| {
                (
                    format!("spiffe://{}", ca.trust_domain().as_str()),
                    ca.certificate().to_vec(),
                )
            })
            .collect()
    }

    fn jwt_bundles_json(&self) -> HashMap<String, Vec<u8>> {
        std::iter::once(&self.ca)
            .chain(self.federated.iter())
            .map(|ca| {
                (
                    format!("spiffe://{}", ca.trust_domain().as_str()),
                    ca.jwks(),
                )
            })
            .collect()
    }

    pub(crate) fn jwt_bundles(&self) -> JwtBundles {
        let mut bundles = JwtBundles::default();
        for ca in std::iter::once(&self.ca).chain(self.federated.iter()) {
            if let Err(e) = bundles.insert_jwks(ca.trust_domain().clone(), &ca.jwks()) {
                tracing::error!(error = %e, "dev CA produced an unusable JWKS");
            }
        }
        bundles
    }
}

/// The service behind one socket.
pub(crate) struct WorkloadService {
    pub(crate) shared: Arc<Shared>,
    pub(crate) socket: PathBuf,
}

type BoxStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send + 'static>>;

/// The header every Workload API call must carry (SPIFFE Workload Endpoint spec; SPIRE checks
/// it to stop browsers and SSRF from reaching the API).
const SECURITY_HEADER: &str = "workload.spiffe.io";

impl WorkloadService {
    /// Checks the security header and returns the IDs this caller is entitled to.
    fn entitled<T>(&self, request: &Request<T>) -> Result<Vec<SpiffeId>, Status> {
        match request.metadata().get(SECURITY_HEADER) {
            Some(v) if v.as_bytes() == b"true" => {}
            _ => {
                return Err(Status::invalid_argument(
                    "security header missing from request",
                ));
            }
        }
        let uid = request
            .extensions()
            .get::<UdsConnectInfo>()
            .and_then(|i| i.peer_cred)
            .map(|c| c.uid());
        let mut ids: Vec<SpiffeId> = Vec::new();
        for r in &self.shared.registrations {
            if r.matches(&self.socket, uid) && !ids.contains(&r.spiffe_id) {
                ids.push(r.spiffe_id.clone());
            }
        }
        if ids.is_empty() {
            tracing::warn!(socket = %self.socket.display(), uid = ?uid, "no registration matches the caller");
            return Err(Status::permission_denied("no identity issued"));
        }
        Ok(ids)
    }

    fn x509_response(&self, ids: &[SpiffeId], issued: &Issued) -> Result<X509svidResponse, Status> {
        let bundle = self.shared.ca.certificate().to_vec();
        let mut svids = Vec::with_capacity(ids.len());
        for id in ids {
            let svid = issued
                .svids
                .get(id)
                .ok_or_else(|| Status::internal(format!("no SVID issued for {}", id.as_str())))?;
            svids.push(X509svid {
                spiffe_id: id.as_str().to_string(),
                x509_svid: svid.chain.iter().flat_map(|c| c.iter().copied()).collect(),
                x509_svid_key: svid.key.secret_pkcs8_der().to_vec(),
                bundle: bundle.clone(),
                hint: String::new(),
            });
        }
        let own = format!("spiffe://{}", self.shared.ca.trust_domain().as_str());
        let federated_bundles = self
            .shared
            .x509_bundles()
            .into_iter()
            .filter(|(td, _)| *td != own)
            .collect();
        Ok(X509svidResponse {
            svids,
            crl: Vec::new(),
            federated_bundles,
        })
    }
}

/// A stream that yields `make(current)` now and again after every rotation, and ends when the
/// server shuts down.
fn follow_issued<T, F>(shared: &Arc<Shared>, make: F) -> BoxStream<T>
where
    T: Send + PartialEq + Clone + 'static,
    F: Fn(&Issued) -> Result<T, Status> + Send + Sync + 'static,
{
    struct St<T, F> {
        issued: watch::Receiver<Arc<Issued>>,
        shutdown: watch::Receiver<bool>,
        first: bool,
        last: Option<T>,
        make: F,
    }
    let state = St {
        issued: shared.issued.subscribe(),
        shutdown: shared.shutdown.clone(),
        first: true,
        last: None,
        make,
    };
    Box::pin(futures::stream::unfold(state, |mut st| async move {
        loop {
            if !st.first {
                tokio::select! {
                    changed = st.issued.changed() => if changed.is_err() { return None },
                    _ = st.shutdown.wait_for(|s| *s) => return None,
                }
            }
            st.first = false;
            let current = st.issued.borrow_and_update().clone();
            match (st.make)(&current) {
                Ok(msg) => {
                    // Only send what changed (bundle streams do not change on SVID rotation).
                    if st.last.as_ref() == Some(&msg) {
                        continue;
                    }
                    st.last = Some(msg.clone());
                    return Some((Ok(msg), st));
                }
                Err(status) => return Some((Err(status), st)),
            }
        }
    }))
}

fn json_to_prost(value: &serde_json::Value) -> prost_types::Value {
    use prost_types::value::Kind;
    let kind = match value {
        serde_json::Value::Null => Kind::NullValue(0),
        serde_json::Value::Bool(b) => Kind::BoolValue(*b),
        serde_json::Value::Number(n) => Kind::NumberValue(n.as_f64().unwrap_or(0.0)),
        serde_json::Value::String(s) => Kind::StringValue(s.clone()),
        serde_json::Value::Array(a) => Kind::ListValue(prost_types::ListValue {
            values: a.iter().map(json_to_prost).collect(),
        }),
        serde_json::Value::Object(o) => Kind::StructValue(prost_types::Struct {
            fields: o
                .iter()
                .map(|(k, v)| (k.clone(), json_to_prost(v)))
                .collect(),
        }),
    };
    prost_types::Value { kind: Some(kind) }
}

#[tonic::async_trait]
impl SpiffeWorkloadApi for WorkloadService {
    type FetchX509SVIDStream = BoxStream<X509svidResponse>;
    type FetchX509BundlesStream = BoxStream<X509BundlesResponse>;
    type FetchJWTBundlesStream = BoxStream<JwtBundlesResponse>;

    async fn fetch_x509svid(
        &self,
        request: Request<X509svidRequest>,
    ) -> Result<Response<Self::FetchX509SVIDStream>, Status> {
        let ids = self.entitled(&request)?;
        let me = WorkloadService {
            shared: self.shared.clone(),
            socket: self.socket.clone(),
        };
        Ok(Response::new(follow_issued(&self.shared, move |issued| {
            me.x509_response(&ids, issued)
        })))
    }

    async fn fetch_x509_bundles(
        &self,
        request: Request<X509BundlesRequest>,
    ) -> Result<Response<Self::FetchX509BundlesStream>, Status> {
        self.entitled(&request)?;
        let shared = self.shared.clone();
        Ok(Response::new(follow_issued(&self.shared, move |_| {
            Ok(X509BundlesResponse {
                crl: Vec::new(),
                bundles: shared.x509_bundles(),
            })
        })))
    }

    async fn fetch_jwtsvid(
        &self,
        request: Request<JwtsvidRequest>,
    ) -> Result<Response<JwtsvidResponse>, Status> {
        let ids = self.entitled(&request)?;
        let req = request.into_inner();
        if req.audience.is_empty() {
            return Err(Status::invalid_argument("audience must be specified"));
        }
        let ids = if req.spiffe_id.is_empty() {
            ids
        } else {
            let want = SpiffeId::parse(&req.spiffe_id)
                .map_err(|e| Status::invalid_argument(e.to_string()))?;
            if !ids.contains(&want) {
                return Err(Status::permission_denied(format!(
                    "no identity issued for {}",
                    want.as_str()
                )));
            }
            vec![want]
        };
        let mut svids = Vec::new();
        for id in ids {
            let token = self
                .shared
                .ca
                .issue_jwt(&id, &req.audience, self.shared.jwt_ttl)
                .map_err(|e| Status::internal(e.to_string()))?;
            svids.push(Jwtsvid {
                spiffe_id: id.as_str().to_string(),
                svid: token,
                hint: String::new(),
            });
        }
        Ok(Response::new(JwtsvidResponse { svids }))
    }

    async fn fetch_jwt_bundles(
        &self,
        request: Request<JwtBundlesRequest>,
    ) -> Result<Response<Self::FetchJWTBundlesStream>, Status> {
        self.entitled(&request)?;
        let shared = self.shared.clone();
        Ok(Response::new(follow_issued(&self.shared, move |_| {
            Ok(JwtBundlesResponse {
                bundles: shared.jwt_bundles_json(),
            })
        })))
    }

    async fn validate_jwtsvid(
        &self,
        request: Request<ValidateJwtsvidRequest>,
    ) -> Result<Response<ValidateJwtsvidResponse>, Status> {
        self.entitled(&request)?;
        let req = request.into_inner();
        if req.audience.is_empty() {
            return Err(Status::invalid_argument("audience must be specified"));
        }
        if req.svid.is_empty() {
            return Err(Status::invalid_argument("svid must be specified"));
        }
        let validated = self
            .shared
            .jwt_bundles()
            .validate_claims(&req.svid, &req.audience, SystemTime::now())
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok(Response::new(ValidateJwtsvidResponse {
            spiffe_id: validated.spiffe_id.as_str().to_string(),
            claims: Some(prost_types::Struct {
                fields: validated
                    .claims
                    .iter()
                    .map(|(k, v)| (k.clone(), json_to_prost(v)))
                    .collect(),
            }),
        }))
    }
}
