pub async fn run(_args: crate::cli::DemoArgs) -> anyhow::Result<()> {
    anyhow::bail!("demo: not yet")
}
