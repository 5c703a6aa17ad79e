use super::*;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

fn proc_path(file: &MemFile) -> PathBuf {
    PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), file.raw_fd()))
}

#[test]
fn what_one_mapping_writes_the_other_reads() {
    let made = MemFile::create(c"test", 8192, false).unwrap();
    // SAFETY: a duplicate of the descriptor, owned by the second mapping only.
    let fd = unsafe { libc::dup(made.raw_fd()) };
    let inherited = unsafe { MemFile::inherit(fd, 8192) }.unwrap();
    // SAFETY: this test is the only reader and writer.
    unsafe {
        made.mapping()
            .bytes_mut(4000, 5)
            .unwrap()
            .copy_from_slice(b"hello");
        assert_eq!(inherited.mapping().bytes(4000, 5).unwrap(), b"hello");
    }
    inherited
        .mapping()
        .word(8184)
        .unwrap()
        .store(7, Ordering::Relaxed);
    assert_eq!(
        made.mapping().word(8184).unwrap().load(Ordering::Relaxed),
        7
    );
}

#[test]
fn a_sealed_file_opens_through_proc_and_keeps_its_size() {
    let made = MemFile::create(c"test", 4096, true).unwrap();
    let opened = MemFile::open(&proc_path(&made), 4096).unwrap();
    made.mapping().word(0).unwrap().store(42, Ordering::Relaxed);
    assert_eq!(
        opened.mapping().word(0).unwrap().load(Ordering::Relaxed),
        42
    );
    // Neither side can shrink or grow it.
    for fd in [made.raw_fd(), opened.raw_fd()] {
        // SAFETY: ftruncate(2) on a descriptor this test owns.
        assert_ne!(unsafe { libc::ftruncate(fd, 0) }, 0);
        assert_ne!(unsafe { libc::ftruncate(fd, 8192) }, 0);
    }
}

#[test]
fn open_refuses_unsealed_files_other_sizes_and_missing_paths() {
    let unsealed = MemFile::create(c"test", 4096, false).unwrap();
    let err = MemFile::open(&proc_path(&unsealed), 4096).err().unwrap();
    assert!(
        err.to_string().contains("not a sealed memory file"),
        "{err}"
    );

    let sealed = MemFile::create(c"test", 4096, true).unwrap();
    let err = MemFile::open(&proc_path(&sealed), 8192).err().unwrap();
    assert!(err.to_string().contains("is 4096 bytes, not 8192"), "{err}");

    let plain = tempfile::NamedTempFile::new().unwrap();
    let err = MemFile::open(plain.path(), 0).err().unwrap();
    assert!(
        err.to_string().contains("not a sealed memory file"),
        "{err}"
    );

    let err = MemFile::open(Path::new("/proc/self/fd/999999"), 4096)
        .err()
        .unwrap();
    assert_eq!(err.kind(), io::ErrorKind::NotFound);
}

#[test]
fn inherit_refuses_a_shorter_file() {
    let made = MemFile::create(c"test", 4096, false).unwrap();
    // SAFETY: a duplicate of the descriptor, owned by the inherited file only (closed with it
    // when inherit fails).
    let fd = unsafe { libc::dup(made.raw_fd()) };
    let err = unsafe { MemFile::inherit(fd, 8192) }.err().unwrap();
    assert!(
        err.to_string().contains("4096 bytes, 8192 were expected"),
        "{err}"
    );
}

#[test]
fn out_of_range_and_misaligned_accesses_are_refused() {
    let file = MemFile::create(c"test", 4096, false).unwrap();
    let map = file.mapping();
    assert!(MemFile::create(c"test", 0, false).is_err());
    assert!(map.word(4096).is_none() && map.word(4092).is_none() && map.word(12).is_none());
    assert!(map.word(4088).is_some());
    // SAFETY: nothing writes the file.
    unsafe {
        assert!(map.bytes(4000, 97).is_none());
        assert!(map.bytes(usize::MAX, 2).is_none());
        assert!(map.lend(4096, 1, || {}).is_none());
        assert_eq!(map.bytes(4000, 96).unwrap().len(), 96);
    }
}

#[test]
fn lent_bytes_release_once_after_their_last_slice_and_outlive_the_file() {
    let file = MemFile::create(c"test", 4096, false).unwrap();
    let released = Arc::new(AtomicUsize::new(0));
    // SAFETY: nothing writes the bytes once lent.
    let lent = unsafe {
        file.mapping()
            .bytes_mut(100, 6)
            .unwrap()
            .copy_from_slice(b"images");
        let released = released.clone();
        file.mapping()
            .lend(100, 6, move || {
                released.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap()
    };
    let tail = lent.slice(3..);
    drop(file);
    drop(lent);
    assert_eq!(released.load(Ordering::SeqCst), 0);
    assert_eq!(&tail[..], b"ges");
    drop(tail);
    assert_eq!(released.load(Ordering::SeqCst), 1);
}
