//! GGUF model files: which file of a repository a quantization tag or a projector names,
//! split models' file names, and one manifest of a model's files ([`parse_model`],
//! [`manifest_of`], [`assemble`]).

use super::cursor::gguf_error;
use super::header::{Header, attributes, parse_file};
use crate::{Container, FormatError, Manifest, Result};

/// Whether the GGUF file at `path` is a model rather than one loaded beside a model (a
/// multimodal projector, an importance matrix, speculative-decoding heads), by llama.cpp's rule.
fn is_model_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    path.ends_with(".gguf")
        && !["mmproj", "imatrix", "mtp-", "eagle3-", "dflash-", "dspark-"].iter().any(|sidecar| name.contains(sidecar))
}

/// The index among `paths` of the GGUF model file llama.cpp's `-hf REPO:TAG` takes: the first
/// whose path holds `TAG.` or `TAG-` (any case), a split model's first part only; for `latest`
/// (no tag), `Q4_K_M`, then `Q8_0`, then the first GGUF model file of any tag.
pub fn file_of_quantization_tag(paths: &[&str], tag: &str) -> Option<usize> {
    let is_first_part = |path: &str| {
        let name = path.rsplit('/').next().unwrap_or(path);
        split_name(name).is_none_or(|(_, part, _)| part == 1)
    };
    let candidates = || (0..paths.len()).filter(|&i| is_model_file(paths[i]) && is_first_part(paths[i]));
    let tags: &[&str] = if tag.is_empty() || tag == "latest" { &["Q4_K_M", "Q8_0"] } else { &[tag] };
    for tag in tags {
        let tag = tag.to_ascii_uppercase();
        let tagged = |i: &usize| {
            let upper = paths[*i].to_ascii_uppercase();
            upper.contains(&format!("{tag}.")) || upper.contains(&format!("{tag}-"))
        };
        if let Some(found) = candidates().find(tagged) {
            return Some(found);
        }
    }
    if tag.is_empty() || tag == "latest" { candidates().next() } else { None }
}

/// The index among `paths` of the first multimodal projector (`mmproj` in its name), which a
/// model's manifest names beside its GGUF file.
pub fn projector_file(paths: &[&str]) -> Option<usize> {
    paths.iter().position(|p| p.ends_with(".gguf") && p.rsplit('/').next().unwrap_or(p).contains("mmproj"))
}

/// The name parts of a split file: `(prefix, part, count)` of `prefix-00001-of-00003.gguf`
/// (1-based part, five digits each as the naming convention says).
pub fn split_name(name: &str) -> Option<(&str, u64, u64)> {
    let stem = name.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, part) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if prefix.is_empty() || !digits(part) || !digits(count) {
        return None;
    }
    Some((prefix, part.parse().ok()?, count.parse().ok()?))
}

/// The file name of part `part` (1-based) of `count` of the split model `prefix`.
pub fn split_file_name(prefix: &str, part: u64, count: u64) -> String {
    format!("{prefix}-{part:05}-of-{count:05}.gguf")
}

/// The manifest of a GGUF model held in memory: one file, or a split model's parts in order
/// (each with its file name), every part's header parsed and the parts [`assemble`]d.
pub fn parse_model(parts: &[(&str, &[u8])]) -> Result<Manifest> {
    let mut headers = Vec::with_capacity(parts.len());
    for (name, bytes) in parts {
        let header = match parse_file(bytes) {
            Err(e) if parts.len() > 1 || split_name(name).is_some() => {
                return Err(FormatError::InShard { shard: (*name).to_owned(), error: Box::new(e) });
            }
            header => header?,
        };
        headers.push(((*name).to_owned(), header, bytes.len() as u64));
    }
    manifest_of(headers)
}

/// The manifest of a GGUF model from its files' headers, each `(file name, header, file
/// length)` in part order: a lone file not named as a part is its own model, anything else a
/// split model's parts, [`assemble`]d.
pub fn manifest_of(mut parts: Vec<(String, Header, u64)>) -> Result<Manifest> {
    if parts.len() == 1 && split_name(&parts[0].0).is_none() {
        let (_, header, file_len) = parts.pop().expect("one part");
        return header.into_manifest(file_len);
    }
    assemble(&parts.iter().map(|(name, header, len)| (name.as_str(), header, *len)).collect::<Vec<_>>())
}

/// One manifest of a split model's parts, each `(file name, header, file length)`, in part
/// order: every part present once, agreeing on the count, and the tensors together as many as
/// `split.tensors.count` says, each name once. Part 1's metadata is the model's.
pub fn assemble(parts: &[(&str, &Header, u64)]) -> Result<Manifest> {
    let count = parts.len() as u64;
    let mut objects = Vec::new();
    let mut names = std::collections::HashSet::new();
    let mut declared = None;
    let split_error = |detail: String| gguf_error("gguf_split", 0, detail);
    let mut first = None;
    for (index, &(name, header, file_len)) in parts.iter().enumerate() {
        let in_part = |e: FormatError| FormatError::InShard { shard: name.to_owned(), error: Box::new(e) };
        let Some(split) = header.split else {
            return Err(in_part(split_error("a part of a split model without split.* keys".into())));
        };
        if split.index != index as u64 || split.count != count {
            let detail = format!(
                "split.no {} of split.count {}, where part {} of {count} belongs",
                split.index,
                split.count,
                index + 1
            );
            return Err(in_part(split_error(detail)));
        }
        if *declared.get_or_insert(split.tensors) != split.tensors {
            return Err(in_part(split_error(format!("split.tensors.count {} differs from part 1's", split.tensors))));
        }
        for tensor in header.tensors.iter() {
            if !names.insert(tensor.name.clone()) {
                return Err(in_part(gguf_error(
                    "gguf_duplicate_tensor",
                    0,
                    format!("tensor {:?} is in two parts", tensor.name),
                )));
            }
        }
        objects.extend(header.tensors.iter().map(|t| t.clone().into_object(index)));
        if index == 0 {
            first = Some((header, file_len));
        }
    }
    if declared != Some(objects.len() as u64) {
        let detail =
            format!("split.tensors.count is {}, the parts hold {} tensors", declared.unwrap_or(0), objects.len());
        return Err(split_error(detail));
    }
    let (header, file_len) = first.ok_or_else(|| split_error("no parts".into()))?;
    let attributes = attributes(&header.metadata);
    Manifest::new(
        Container::Gguf,
        Some(header.version.to_string()),
        attributes,
        objects,
        0..header.data_start,
        file_len,
    )
}
