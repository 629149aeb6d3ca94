"""GGUF files written by the `gguf` package (ggml's own Python writer), and read back by its
reader, for the GGUF interop tests (run in the `gguf` venv; `ztensor` in `ztensor-2.1.2`'s).

  write DIR            writes the models below DIR and DIR/expect.json: per model id its files
                       and per tensor its GGML type, numpy shape, and its bytes as the `gguf`
                       reader returns them (a .bin file beside it)
  hub ENDPOINT DIR     picks the Q4_0 file of org/tiny-quants from the file list, as
                       llama-cpp-python's `Llama.from_pretrained` does (HfFileSystem.ls, then
                       fnmatch), downloads it with hf_hub_download, downloads the split model's
                       repository whole with snapshot_download, and checks every tensor of
                       every file downloaded against the files written
  ztensor DIR          opens every single-file model of DIR/expect.json with ztensor 2.1.2's
                       GGUF reader: prints, per model, each tensor's layout, having checked its
                       shape and bytes against the gguf reader's, or why ztensor refuses the file
  demo DIR             reads the demo's GGUF files (DIR/tiny-F16.gguf, DIR/tiny-Q8_0.gguf,
                       written by `ztserve write-demo`) with the gguf reader, and checks that the
                       Q8_0 file's blocks are what the gguf package's quantizer makes of the
                       F16 file's values
  pulled DIR FILE ID   opens FILE, a .zt that `ztserve pull` rebuilt from model ID, with
                       ztensor 2.1.2 and checks every tensor's layout, shape and bytes
"""

import fnmatch
import json
import os
import sys
from pathlib import Path

import numpy as np

try:
    import gguf
    from gguf import GGMLQuantizationType as Q

    # The types the gguf package quantizes to: each written from its own quantizer's blocks.
    QUANTIZED = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.TQ1_0, Q.TQ2_0, Q.MXFP4]
    # Types it has no quantizer for (the K-quants, IQ types): written as blocks of arbitrary
    # bytes of the type's geometry, which the writer and the reader take as they are.
    RAW_BLOCKS = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.Q8_K, Q.IQ2_XXS, Q.IQ4_XS, Q.IQ1_M]
except ImportError:  # the ztensor venv, which reads only
    gguf = None


def rng(seed):
    return np.random.default_rng(seed)


def writer(path, split_max_tensors=0):
    w = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    w.add_name("tiny")
    # The specification requires it of a file with quantized tensors; llama.cpp's converters
    # write it, the writer alone does not.
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(64)
    w.add_embedding_length(256)
    w.add_block_count(1)
    w.add_head_count(4)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    # A vocabulary long enough to be summarised in a manifest.
    w.add_token_list([f"tok{i}" for i in range(300)])
    w.add_token_scores([float(i) for i in range(300)])
    w.add_bool("tiny.flag", True)
    w.add_array("tiny.small", [1, 2, 3])
    return w


def dense_tensors(w, seed):
    r = rng(seed)
    w.add_tensor("dense.f32", r.standard_normal((3, 5)).astype(np.float32))
    w.add_tensor("dense.f16", r.standard_normal((2, 4, 6)).astype(np.float16))
    w.add_tensor("dense.f64", r.standard_normal((7,)).astype(np.float64))
    w.add_tensor("dense.i8", r.integers(-128, 127, (4, 4)).astype(np.int8))
    w.add_tensor("dense.i16", r.integers(-3000, 3000, (5,)).astype(np.int16))
    w.add_tensor("dense.i32", r.integers(-(2**31), 2**31 - 1, (2, 3)).astype(np.int32))
    w.add_tensor("dense.i64", r.integers(-(2**40), 2**40, (3,)).astype(np.int64))
    bf16 = gguf.quants.quantize(r.standard_normal((8, 16)).astype(np.float32), Q.BF16)
    w.add_tensor("dense.bf16", bf16, raw_dtype=Q.BF16)


def quantized_tensor(w, name, qtype, rows, seed):
    if qtype in RAW_BLOCKS:
        block_elements, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
        blocks = rng(seed).integers(0, 256, (rows, 512 // block_elements * block_bytes)).astype(np.uint8)
        w.add_tensor(name, blocks, raw_dtype=qtype)
        return
    data = rng(seed).standard_normal((rows, 512)).astype(np.float32)
    w.add_tensor(name, gguf.quants.quantize(data, qtype), raw_dtype=qtype)


def finish(w):
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def describe(paths):
    """Every tensor of the files at `paths` (one model), as the gguf reader sees it."""
    tensors = {}
    for path in paths:
        reader = gguf.GGUFReader(path)
        for t in reader.tensors:
            bin_path = ROOT / "bins" / f"{path.name}.{t.name}.bin"
            bin_path.parent.mkdir(exist_ok=True)
            bin_path.write_bytes(np.ascontiguousarray(t.data).tobytes())
            tensors[t.name] = {
                "type": t.tensor_type.name,
                "shape": [int(d) for d in reversed(t.shape.tolist())],
                "bytes": int(t.n_bytes),
                "bin": str(bin_path.relative_to(ROOT)),
            }
    return tensors


def write(root):
    global ROOT
    ROOT = root
    expect = {}
    # One file named model.gguf: the directory is the model.
    single = root / "org/tiny-gguf/model.gguf"
    single.parent.mkdir(parents=True, exist_ok=True)
    w = writer(single)
    dense_tensors(w, 1)
    quantized_tensor(w, "blk.0.attn_q.weight", Q.Q8_0, 8, 2)
    finish(w)
    expect["org/tiny-gguf"] = {"files": ["org/tiny-gguf/model.gguf"], "tensors": describe([single])}
    # A repository of quantizations: one file per type, and a README they share.
    quants = root / "org/tiny-quants"
    quants.mkdir(parents=True, exist_ok=True)
    (quants / "README.md").write_text("# tiny\nQuantizations of tiny.\n")
    for i, qtype in enumerate(QUANTIZED + RAW_BLOCKS):
        path = quants / f"tiny-{qtype.name}.gguf"
        w = writer(path)
        quantized_tensor(w, "blk.0.ffn_up.weight", qtype, 6, 10 + i)
        quantized_tensor(w, "blk.0.ffn_down.weight", qtype, 4, 30 + i)
        w.add_tensor("output_norm.weight", rng(50 + i).standard_normal((512,)).astype(np.float32))
        finish(w)
        expect[f"org/tiny-quants/tiny-{qtype.name}"] = {
            "files": [str(path.relative_to(root))],
            "tensors": describe([path]),
        }
    # A split model: three parts of two tensors each, as gguf-split names them.
    split_dir = root / "org/tiny-split"
    split_dir.mkdir(parents=True, exist_ok=True)
    w = writer(split_dir / "tiny-Q8_0.gguf", split_max_tensors=2)
    for n in range(6):
        quantized_tensor(w, f"blk.{n}.attn_k.weight", Q.Q8_0, 2 + n, 70 + n)
    finish(w)
    parts = sorted(split_dir.glob("tiny-Q8_0-*-of-*.gguf"))
    assert len(parts) == 3, parts
    expect["org/tiny-split/tiny-Q8_0"] = {
        "files": [str(p.relative_to(root)) for p in parts],
        "tensors": describe(parts),
    }
    (root / "expect.json").write_text(json.dumps(expect, indent=1, sort_keys=True))
    print(json.dumps({"models": len(expect)}))


def same_tensors(downloaded, written):
    a, b = gguf.GGUFReader(downloaded), gguf.GGUFReader(written)
    assert [t.name for t in a.tensors] == [t.name for t in b.tensors], downloaded
    for x, y in zip(a.tensors, b.tensors):
        assert x.tensor_type == y.tensor_type and list(x.shape) == list(y.shape), x.name
        assert np.ascontiguousarray(x.data).tobytes() == np.ascontiguousarray(y.data).tobytes(), x.name
    assert Path(downloaded).read_bytes() == Path(written).read_bytes(), downloaded
    return len(a.tensors)


def hub(endpoint, root):
    os.environ["HF_ENDPOINT"] = endpoint
    os.environ["HF_HUB_DISABLE_TELEMETRY"] = "1"
    from huggingface_hub import HfApi, HfFileSystem, hf_hub_download, snapshot_download

    checked = {}
    refs = HfApi().list_repo_refs("org/tiny-quants", include_pull_requests=True)
    assert [b.name for b in refs.branches] == ["main"] and refs.tags == [] and refs.pull_requests == [], refs
    assert refs.branches[0].target_commit == HfApi().model_info("org/tiny-quants").sha, refs
    # llama-cpp-python's Llama.from_pretrained(repo_id, filename="*Q4_0.gguf"): list the
    # repository's files, match the pattern, download the one match.
    repo = "org/tiny-quants"
    files = [f["name"] if isinstance(f, dict) else f for f in HfFileSystem().ls(repo, detail=True)]
    names = [str(Path(f).relative_to(repo)) for f in files]
    matching = [n for n in names if fnmatch.fnmatch(n, "*Q4_0.gguf")]
    assert matching == ["tiny-Q4_0.gguf"], names
    assert "README.md" in names, names
    local = hf_hub_download(repo, matching[0], local_dir=str(root / "download"))
    checked[matching[0]] = same_tensors(local, root / repo / matching[0])
    # A split model's repository, whole.
    snapshot = Path(snapshot_download("org/tiny-split", local_dir=str(root / "snapshot")))
    parts = sorted(p.name for p in snapshot.glob("*.gguf"))
    assert parts == [f"tiny-Q8_0-0000{n}-of-00003.gguf" for n in (1, 2, 3)], parts
    for name in parts:
        checked[name] = same_tensors(snapshot / name, root / "org/tiny-split" / name)
    print(json.dumps({"checked": checked}))


def with_ztensor(root):
    import ztensor

    expect = json.loads((root / "expect.json").read_text())
    layouts, refused = {}, {}
    for model, entry in expect.items():
        if len(entry["files"]) != 1:
            continue
        try:
            source = ztensor.open(str(root / entry["files"][0]))
        except Exception as e:  # a type its reader has no projection for
            refused[model] = str(e)
            continue
        layouts[model] = {}
        for name, tensor in entry["tensors"].items():
            t = source[name]
            assert list(t.shape) == tensor["shape"], (model, name, t.shape)
            assert t.tobytes() == (root / tensor["bin"]).read_bytes(), (model, name)
            layouts[model][name] = t.layout
    print(json.dumps({"layouts": layouts, "refused": refused}))


def demo(root):
    f16 = gguf.GGUFReader(root / "tiny-F16.gguf")
    q8 = gguf.GGUFReader(root / "tiny-Q8_0.gguf")
    checked = 0
    for a, b in zip(f16.tensors, q8.tensors, strict=True):
        assert a.name == b.name and list(a.shape) == list(b.shape), (a.name, b.name)
        values = np.asarray(a.data, dtype=np.float32)
        if b.tensor_type == Q.Q8_0:
            assert a.tensor_type == Q.F16, a.name
            assert gguf.quants.quantize(values, Q.Q8_0).tobytes() == np.asarray(b.data).tobytes(), a.name
            checked += 1
        else:
            assert np.array_equal(values, np.asarray(b.data, dtype=np.float32)), a.name
    assert q8.fields["general.architecture"].contents() == "llama"
    print(json.dumps({"quantized": checked}))


def pulled(root, path, model):
    import ztensor

    expect = json.loads((root / "expect.json").read_text())[model]
    source = ztensor.open(str(path))
    assert sorted(source.keys()) == sorted(expect["tensors"]), (sorted(source.keys()), model)
    for name, tensor in expect["tensors"].items():
        t = source[name]
        dense = tensor["type"] in ("F32", "F16", "BF16", "F64", "I8", "I16", "I32", "I64")
        assert t.layout == ("dense" if dense else f"gguf.{tensor['type'].lower()}/1"), (name, t.layout)
        assert list(t.shape) == tensor["shape"], (name, t.shape)
        assert t.tobytes() == (root / tensor["bin"]).read_bytes(), name
    print(json.dumps({"pulled": len(expect["tensors"])}))


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "write":
        write(Path(sys.argv[2]))
    elif mode == "hub":
        hub(sys.argv[2], Path(sys.argv[3]))
    elif mode == "ztensor":
        with_ztensor(Path(sys.argv[2]))
    elif mode == "demo":
        demo(Path(sys.argv[2]))
    elif mode == "pulled":
        pulled(Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4])
    else:
        sys.exit(f"unknown mode {mode}")
