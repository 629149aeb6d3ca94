use super::*;
use crate::{Limits, Object, V2_MAGIC};

/// The official writer's seekable file, laid out again by [`plan`] at 4096 and 64 KiB:
/// the same objects, the same decoded bytes, every digest still matching.
#[test]
fn a_planned_file_holds_the_same_parts() {
    let original = include_bytes!("../../../fuzz/seeds/seed-official-2.1.2.zt");
    let manifest = crate::parse_file(original, &Limits::default()).unwrap();
    for alignment in [4096, 65536] {
        let objects: Vec<&Object> = manifest.objects.iter().collect();
        let plan = plan(&objects, manifest.attributes.as_ref(), alignment);
        let mut file = vec![0u8; (plan.tail_offset as usize) + plan.tail.len()];
        file[..8].copy_from_slice(V2_MAGIC);
        for (object, offsets) in manifest.objects.iter().zip(&plan.offsets) {
            for (c, &offset) in object.components.iter().zip(offsets) {
                assert_eq!(offset % alignment, 0);
                file[offset as usize..(offset + c.stored_length) as usize]
                    .copy_from_slice(&original[c.stored_range().start as usize..c.stored_range().end as usize]);
            }
        }
        file[plan.tail_offset as usize..].copy_from_slice(&plan.tail);
        let report = crate::verify::verify_file(&file, &Limits::default());
        assert!(report.is_valid() && report.digests_checked == 6, "{:?}", report.errors);
        let replanned = crate::parse_file(&file, &Limits::default()).unwrap();
        assert_eq!(replanned.attributes, manifest.attributes);
        for (a, b) in manifest.objects.iter().zip(&replanned.objects) {
            assert_eq!((&a.name, &a.shape, &a.format), (&b.name, &b.shape, &b.format));
        }
    }
}
