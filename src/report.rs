//! `krefine report`: metrics of one or more run directories as text, Markdown, JSON or CSV.

/// Output format of `krefine report`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Text,
    Md,
    Json,
    Csv,
}
