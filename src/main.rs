//! The gpuloop binary: everything lives in the library; this only hands over the exit code.

fn main() {
    std::process::exit(gpuloop::cli::main());
}
