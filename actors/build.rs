//! Generates the client and server of the `tidemark.v1.Worker` gRPC service
//! without protoc: tonic-build's `manual` module writes them from this
//! description, and the messages are prost structs in `src/control.rs`.

use tonic_build::manual::{Builder, Method, Service};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    const CODEC: &str = "tonic_prost::ProstCodec";
    let method = |name: &str, route: &str, input: &str, output: &str| {
        Method::builder()
            .name(name)
            .route_name(route)
            .input_type(format!("crate::control::{input}"))
            .output_type(format!("crate::control::{output}"))
            .codec_path(CODEC)
    };
    let worker = Service::builder()
        .name("Worker")
        .package("tidemark.v1")
        .method(method("info", "Info", "Empty", "WorkerInfo").build())
        .method(
            method("attempt", "Attempt", "Command", "Event")
                .client_streaming()
                .server_streaming()
                .build(),
        )
        .build();
    Builder::new().compile(&[worker]);
}
