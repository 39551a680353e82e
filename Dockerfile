# prefix-router's image: built in a Rust stage, run from a distroless base (glibc, CA
# certificates, no shell) as a non-root user.
#   docker build -t prefix-router .
#   docker run -p 8080:8080 prefix-router serve --listen 0.0.0.0:8080 --instance http://ENGINE:8000
# (the default listen address is 127.0.0.1, unreachable from outside the container; the default
# command wants a config file mounted at /etc/prefix-router/router.toml, as the Deployment does)
# deploy/kubernetes/ runs it (readOnlyRootFilesystem: it writes nothing but its optional
# access log, which belongs on a mounted volume).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# release-lto (Cargo.toml): link-time optimised, the build bench/peers.sh measures.
RUN cargo build --profile release-lto --locked -p prefix-router \
 && cp target/release-lto/prefix-router /prefix-router

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /prefix-router /usr/local/bin/prefix-router
USER nonroot:nonroot
EXPOSE 8080 9002 9090
ENTRYPOINT ["/usr/local/bin/prefix-router"]
CMD ["serve", "--config", "/etc/prefix-router/router.toml"]
