# syntax=docker/dockerfile:1
# argocd-agent-rs: one image with both binaries (argocd-agent: principal and agent;
# argocd-agentctl: operator tooling). Build (docs/deploy.md):
#
#   docker build -t ghcr.io/argoproj-labs/argocd-agent-rs:0.1.0 \
#     --build-arg GIT_COMMIT=$(git rev-parse --short=12 HEAD) .
#
# (`podman build` takes the same arguments.) Only the CLI package is built: its default build
# links no test code (the test kit, the Kubernetes API test server, the development
# certificate issuer and the load generator live in other packages; `argocd-agent-dev` is the
# developer tool). e2e/tests/image.rs checks this file.

ARG RUST_VERSION=1.95

# ---- build: compile the release binaries --------------------------------------------------
FROM docker.io/library/rust:${RUST_VERSION}-slim-bookworm AS build
WORKDIR /src
COPY . .
# The build context has no .git (see .dockerignore): cli/build.rs takes the commit from here.
ARG GIT_COMMIT=unknown
ENV ARGOCD_AGENT_GIT_COMMIT=${GIT_COMMIT}
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p argocd-agent-cli --bins \
 && install -D -m 0755 target/release/argocd-agent /out/argocd-agent \
 && install -D -m 0755 target/release/argocd-agentctl /out/argocd-agentctl

# ---- runtime: glibc + libgcc only (what the binaries link), no shell, non-root -------------
FROM gcr.io/distroless/cc-debian12:nonroot AS runtime
ARG VERSION=0.1.0
ARG GIT_COMMIT=unknown
LABEL org.opencontainers.image.title="argocd-agent-rs" \
      org.opencontainers.image.description="SPIFFE-native argocd-agent: principal and agent" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${GIT_COMMIT}" \
      org.opencontainers.image.source="https://github.com/argoproj-labs/argocd-agent-rs" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /out/argocd-agent /usr/local/bin/argocd-agent
COPY --from=build /out/argocd-agentctl /usr/local/bin/argocd-agentctl
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/argocd-agent"]
