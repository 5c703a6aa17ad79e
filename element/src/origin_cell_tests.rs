use super::*;
use crate::error::DatasetError;

#[test]
fn origins_say_whether_they_count_from_zero() {
    for (position, want) in [
        (
            RecordPosition::Record(17),
            "record 17 (0-based) of '/data/a.tfrecord': bad",
        ),
        (RecordPosition::Line(3), "line 3 of '/data/a.tfrecord': bad"),
    ] {
        let cell = OriginCell::default();
        assert_eq!(
            cell.attach(DatasetError::invalid("bad")).to_string(),
            "bad",
            "an empty cell names nothing"
        );
        cell.set(&Arc::from("/data/a.tfrecord"), position);
        assert_eq!(cell.attach(DatasetError::invalid("bad")).to_string(), want);
    }
}
