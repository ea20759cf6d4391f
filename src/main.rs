fn main() {
    std::process::exit(xpackfs::cli::main());
}
