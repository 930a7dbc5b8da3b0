//! Compiles `proto/` with protox (pure Rust, no system protoc) and prost-build.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../proto");
    let files = ["atasira/v1/envelope.proto", "atasira/v1/drafts.proto", "atasira/v1/c9.proto"];
    let descriptors = protox::compile(files, [&root])?;
    prost_build::Config::new().compile_fds(descriptors)?;
    for f in files {
        println!("cargo:rerun-if-changed={}", root.join(f).display());
    }
    Ok(())
}
