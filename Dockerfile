# prefix-router's image: built in a Rust stage, run from a distroless base (glibc, CA
# certificates, no shell) as a non-root user.
#   docker build -t prefix-router .
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
