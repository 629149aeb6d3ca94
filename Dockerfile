# syntax=docker/dockerfile:1
# Multi-stage build: compile in the Rust image, run from a slim Debian with a non-root user.
# scripts/image-smoke builds this file unchanged and checks the running image.
FROM rust:1.95-bookworm AS build
WORKDIR /src
# The image's binary carries no debug info: a smaller image and a faster build.
ENV CARGO_PROFILE_RELEASE_DEBUG=false \
    CARGO_PROFILE_RELEASE_STRIP=symbols \
    CARGO_INCREMENTAL=0
# Dependencies first, in a layer of their own, built against empty crates: a change to the
# sources rebuilds only ztserve and ztserve-format, not every crate.
COPY Cargo.toml Cargo.lock ./
COPY format/Cargo.toml format/Cargo.toml
RUN mkdir -p src format/src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs format/src/lib.rs \
    && cargo build --release --locked --bin ztserve \
    && rm -rf src format/src
COPY src ./src
COPY format ./format
# cargo rebuilds by modification time, and the copied sources may be older than the empty
# crates built above.
RUN touch src/main.rs src/lib.rs format/src/lib.rs \
    && cargo build --release --locked --bin ztserve

FROM debian:bookworm-slim
# curl serves the HEALTHCHECK only.
RUN apt-get update && apt-get install -y --no-install-recommends curl ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --system --uid 10001 --no-create-home ztserve \
    && mkdir -p /var/lib/ztserve && chown ztserve /var/lib/ztserve
COPY --from=build /src/target/release/ztserve /usr/local/bin/ztserve
COPY config/ztserve.toml /etc/ztserve/ztserve.toml
# The demo models, so the image answers at once; mount your own over /models.
COPY models /models
USER ztserve
ENV ZTSERVE_SERVER__LISTEN=0.0.0.0:8080 \
    ZTSERVE_SOURCES__PATHS=/models \
    ZTSERVE_DIGESTS__STORE=/var/lib/ztserve/digests
# The files' SHA-256 digests, kept across restarts: mount a volume here so a new container
# does not hash every model again.
VOLUME /var/lib/ztserve
# 9000: the S3-compatible endpoint, when ZTSERVE_S3_ENDPOINT__LISTEN=0.0.0.0:9000 turns it on.
EXPOSE 8080 9000
# Liveness only, over TLS when [tls] is set (-k: the certificate names the service, not
# 127.0.0.1, and nothing but /healthz's fixed answer crosses this connection).
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD curl -fsS http://127.0.0.1:8080/healthz || curl -fsSk https://127.0.0.1:8080/healthz || exit 1
# Same command the tests run: `ztserve serve` with config from /etc and overrides from env.
ENTRYPOINT ["ztserve"]
CMD ["serve", "--config", "/etc/ztserve/ztserve.toml"]
