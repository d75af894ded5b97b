fn main() -> std::process::ExitCode {
    krefine::cli::main()
}
