//! The gpuloop binary: everything lives in the library; this only hands over the exit code
//! (and installs the allocator that counts memory for scripts' `memory` limit).

#[global_allocator]
static ALLOC: gpuloop::memory::Counting = gpuloop::memory::Counting;

fn main() {
    gpuloop::memory::keep_freed_memory();
    std::process::exit(gpuloop::cli::main());
}
