use super::*;
use std::time::Duration;

#[test]
fn label_pairs_past_the_bound_share_the_other_series() {
    let metrics = ClientMetrics::new();
    for i in 0..MAX_LABEL_SETS {
        metrics
            .for_read(&format!("ds-{i}"), Some("job"))
            .delivered(1, 1);
    }
    let cases = [
        // (dataset, job, the series it counts in)
        ("ds-0", Some("job"), ("ds-0", "job")),
        ("ds-63", Some("job"), ("ds-63", "job")),
        ("ds-64", Some("job"), (OTHER, OTHER)),
        ("ds-0", None, (OTHER, OTHER)),
        ("new", Some("other job"), (OTHER, OTHER)),
    ];
    for (dataset, job, (want_dataset, want_job)) in cases {
        metrics.for_read(dataset, job).delivered(10, 0);
        let labels = ReadLabels {
            dataset: want_dataset.into(),
            job: want_job.into(),
        };
        assert!(
            metrics.received_elements.get_or_create(&labels).get() >= 10,
            "{dataset} {job:?}"
        );
    }
    assert_eq!(metrics.label_sets.lock().unwrap().len(), MAX_LABEL_SETS);
    let other = ReadLabels {
        dataset: OTHER.into(),
        job: OTHER.into(),
    };
    assert_eq!(metrics.received_elements.get_or_create(&other).get(), 30);
}

#[test]
fn the_text_names_metrics_and_labels_by_prometheus_conventions() {
    let metrics = ClientMetrics::new();
    let read = metrics.for_read("ds-1", Some("train"));
    read.delivered(3, 100);
    read.delivered(2, 20);
    read.stalled(Duration::from_millis(2));
    metrics.for_read("ds-2", None).delivered(1, 8);
    let text = metrics.encode_text();
    for line in [
        "# TYPE sluice_client_received_elements counter",
        "# UNIT sluice_client_received_elements elements",
        r#"sluice_client_received_elements_total{dataset="ds-1",job="train"} 5"#,
        r#"sluice_client_received_elements_total{dataset="ds-2",job=""} 1"#,
        "# TYPE sluice_client_received_bytes counter",
        "# UNIT sluice_client_received_bytes bytes",
        r#"sluice_client_received_bytes_total{dataset="ds-1",job="train"} 120"#,
        "# TYPE sluice_client_stall_seconds histogram",
        "# UNIT sluice_client_stall_seconds seconds",
        r#"sluice_client_stall_seconds_count{dataset="ds-1",job="train"} 1"#,
        r#"sluice_client_stall_seconds_bucket{le="0.0064",dataset="ds-1",job="train"} 1"#,
        r#"sluice_client_stall_seconds_bucket{le="0.0016",dataset="ds-1",job="train"} 0"#,
        "# EOF",
    ] {
        assert!(text.lines().any(|l| l == line), "no {line:?} in:\n{text}");
    }
}

#[test]
fn a_registry_of_the_application_encodes_the_client_metrics_beside_its_own() {
    let mut registry = Registry::default();
    let own: Counter = Counter::default();
    registry.register("app_steps", "Training steps", own.clone());
    let metrics = ClientMetrics::new();
    metrics.register(&mut registry);
    own.inc();
    metrics.for_read("ds", Some("j")).delivered(4, 4);
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(text.contains("app_steps_total 1"), "{text}");
    assert!(
        text.contains(r#"sluice_client_received_elements_total{dataset="ds",job="j"} 4"#),
        "{text}"
    );
}
