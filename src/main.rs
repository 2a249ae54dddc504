fn main() {
    std::process::exit(ctxfs::cli::run());
}
