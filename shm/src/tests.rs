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
    let opened = MemFile::open(&proc_path(&made), c"test", 4096).unwrap();
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
fn open_refuses_what_is_not_a_sealed_memory_file_of_its_name_and_size() {
    let unsealed = MemFile::create(c"test", 4096, false).unwrap();
    let err = MemFile::open(&proc_path(&unsealed), c"test", 4096)
        .err()
        .unwrap();
    assert!(
        err.to_string().contains("not a sealed memory file"),
        "{err}"
    );

    let sealed = MemFile::create(c"test", 4096, true).unwrap();
    let err = MemFile::open(&proc_path(&sealed), c"test", 8192)
        .err()
        .unwrap();
    assert!(err.to_string().contains("is 4096 bytes, not 8192"), "{err}");
    // Another name, or one that only starts like it.
    let longer = MemFile::create(c"test-2", 4096, true).unwrap();
    for (file, name) in [(&sealed, c"tes"), (&sealed, c"other"), (&longer, c"test")] {
        let err = MemFile::open(&proc_path(file), name, 4096).err().unwrap();
        assert!(
            err.to_string().contains("is not a memory file named"),
            "{err}"
        );
    }

    // Not a memory file at all: a link to a plain file, a pipe, a plain file (no link).
    let plain = tempfile::NamedTempFile::new().unwrap();
    let link = plain.path().with_extension("link");
    std::os::unix::fs::symlink(plain.path(), &link).unwrap();
    let err = MemFile::open(&link, c"test", 0).err().unwrap();
    std::fs::remove_file(&link).unwrap();
    assert!(
        err.to_string().contains("is not a memory file named"),
        "{err}"
    );
    let mut fds = [0; 2];
    // SAFETY: pipe(2) into an array of two descriptors, closed below.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let pipe = PathBuf::from(format!("/proc/self/fd/{}", fds[0]));
    let err = MemFile::open(&pipe, c"test", 0).err().unwrap();
    // SAFETY: closing the pipe's descriptors, which nothing else owns.
    unsafe {
        libc::close(fds[0]);
        libc::close(fds[1]);
    }
    assert!(
        err.to_string().contains("is not a memory file named"),
        "{err}"
    );
    let err = MemFile::open(plain.path(), c"test", 0).err().unwrap();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");

    let err = MemFile::open(Path::new("/proc/self/fd/999999"), c"test", 4096)
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

#[test]
fn a_mapped_file_reads_as_its_bytes_and_outlives_its_unlinking() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("blob");
    let data: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::File::create(&path)
        .unwrap()
        .write_all(&data)
        .unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let whole = map_file(&file, data.len()).unwrap();
    let head = map_file(&file, 10).unwrap();
    drop(file);
    // Replaced and unlinked, as a cache does: the mapping still reads the old bytes.
    std::fs::write(dir.path().join("new"), b"other").unwrap();
    std::fs::rename(dir.path().join("new"), &path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(&whole[..], &data[..]);
    assert_eq!(&head[..], &data[..10]);
    assert_eq!(whole.slice(99_990..), data[99_990..]);

    let short = std::fs::File::open(tempfile::NamedTempFile::new().unwrap().path()).unwrap();
    let err = map_file(&short, 1).err().unwrap();
    assert!(
        err.to_string().contains("0 bytes, 1 were expected"),
        "{err}"
    );
    assert!(map_file(&short, 0).unwrap().is_empty());
}
