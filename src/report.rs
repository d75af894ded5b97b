//! `krefine report`: metrics of one or more run directories as text, Markdown, JSON or CSV.
