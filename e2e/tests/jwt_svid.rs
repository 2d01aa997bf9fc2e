//! JWT-SVID authentication (principal behind a TLS-terminating ingress): the agent sends a
//! JWT-SVID whose audience is the principal's SPIFFE ID; the principal validates it against
//! the JWT bundles from its own Workload API and maps it like any SVID.

use std::time::Duration;

use argocd_agent_domain::{Event, EventType, Payload};
use argocd_agent_proto::eventstream::event_stream_client::EventStreamClient;
use argocd_agent_testkit::harness::*;
use kube::api::PostParams;

const T: Duration = Duration::from_secs(20);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jwt_svid_agent_syncs_and_bad_tokens_are_refused() {
    let topo = Topology::start(TopologyOptions {
        agents: Some(vec![MANAGED]),
        principal_args: vec!["--auth".into(), "jwt-svid".into()],
        agent_creds: Some("jwt-svid".into()),
        ..Default::default()
    })
    .await
    .unwrap();
    let r: Result<(), HarnessError> = async {
        let hub = apps(&topo.hub, MANAGED)?;
        hub.create(
            &PostParams::default(),
            &sample_app("via-jwt", MANAGED, "guestbook"),
        )
        .await?;
        eventually(
            "hub create reaches the spoke over a JWT-SVID session",
            T,
            || async { stored_app(&topo.managed_spoke, SPOKE_NS, "via-jwt") },
        )
        .await?;

        // A token for the wrong audience, an expired token, and no token are refused.
        let id = argocd_agent_identity::SpiffeId::parse(&agent_id(MANAGED))?;
        let wrong_aud = "spiffe://example.org/somebody-else".to_string();
        let principal = PRINCIPAL_ID.to_string();
        let ca = topo.spiffe.ca();
        let now = std::time::SystemTime::now();
        let tokens = [
            (
                "wrong audience",
                Some(ca.issue_jwt(&id, &[wrong_aud], Duration::from_secs(300))?),
            ),
            (
                "expired",
                Some(ca.issue_jwt_at(
                    &id,
                    std::slice::from_ref(&principal),
                    now - Duration::from_secs(600),
                    now - Duration::from_secs(300),
                )?),
            ),
            ("missing", None),
        ];
        for (what, token) in tokens {
            let channel =
                tonic::transport::Endpoint::from_shared(format!("http://{}", topo.principal_addr))?
                    .connect()
                    .await?;
            let mut client = EventStreamClient::new(channel);
            let hello = Event::new("test", EventType::Hello, Payload::Hello(Default::default()));
            let mut req = tonic::Request::new(tokio_stream::iter(vec![hello.to_cloud_event()]));
            if let Some(t) = token {
                req.metadata_mut()
                    .insert("authorization", format!("Bearer {t}").parse()?);
            }
            match client.subscribe(req).await {
                Ok(_) => return Err(format!("{what} token opened a stream").into()),
                Err(s) => assert_eq!(s.code(), tonic::Code::Unauthenticated, "{what}: {s:?}"),
            }
        }
        Ok(())
    }
    .await;
    topo.finish(r).await;
}
