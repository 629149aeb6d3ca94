"""Bundle signatures as OpenSSF `model_signing` signs a directory with a key (the server and
`ztserve artifacts` read and write the same): an in-toto statement of each file's SHA-256, signed
with an ECDSA key over its DSSE encoding, in a Sigstore bundle naming the key by the SHA-256 of
its PEM. `model_signing` itself checks files on disk, after they are written; a bundle's
signature must be checked before a byte of it is fetched, so the statement is checked here
against the bundle's list of files. Needs `cryptography` (the `signing` extra)."""

import base64
import hashlib
import json
import os

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://model_signing/signature/v1.0"


class BundleRefused(Exception):
    """A bundle that may not be used (its signature, a path, a blob's bytes): the message says why."""


def _pae(payload):
    return b"DSSEv1 %d %s %d %s" % (len(PAYLOAD_TYPE), PAYLOAD_TYPE.encode(), len(payload), payload)


def _hash_of(curve):
    from cryptography.hazmat.primitives import hashes

    by_size = {256: hashes.SHA256, 384: hashes.SHA384, 521: hashes.SHA512}
    if curve.key_size not in by_size:
        raise ValueError(f"an ECDSA key on {curve.name}, where model_signing signs with P-256, P-384 or P-521")
    return by_size[curve.key_size]()


def _hint(public_key):
    from cryptography.hazmat.primitives import serialization

    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def statement(name, files):
    """The statement over `files` (path: SHA-256 hex) of bundle `name`, as bytes."""
    resources = [{"name": path, "algorithm": "sha256", "digest": files[path]} for path in sorted(files)]
    root = hashlib.sha256(b"".join(bytes.fromhex(files[path]) for path in sorted(files))).hexdigest()
    return json.dumps({
        "_type": STATEMENT_TYPE,
        "subject": [{"name": name, "digest": {"sha256": root}}],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": False, "ignore_paths": []},
            "resources": resources,
        },
    }).encode()


def sign(private_key_path, name, files):
    """The signature (a Sigstore bundle, as a dict) of the key in PEM file `private_key_path`
    over `files` (path: SHA-256 hex) of bundle `name` (the statement's subject)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    with open(private_key_path, "rb") as f:
        key = serialization.load_pem_private_key(f.read(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{private_key_path} is not an ECDSA private key (model_signing's key signers)")
    payload = statement(name, files)
    signature = key.sign(_pae(payload), ec.ECDSA(_hash_of(key.curve)))
    b64 = lambda data: base64.b64encode(data).decode()  # noqa: E731
    return {
        "mediaType": BUNDLE_MEDIA_TYPE,
        "verificationMaterial": {"publicKey": {"hint": _hint(key.public_key())}, "tlogEntries": []},
        "dsseEnvelope": {"payload": b64(payload), "payloadType": PAYLOAD_TYPE,
                         "signatures": [{"sig": b64(signature), "keyid": ""}]},
    }


def load_public_keys(paths):
    """The keys of PEM files `paths`, each with its file's name and hint."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    keys = []
    for path in paths:
        with open(path, "rb") as f:
            key = serialization.load_pem_public_key(f.read())
        if not isinstance(key, ec.EllipticCurvePublicKey):
            raise ValueError(f"{path} is not an ECDSA public key")
        keys.append((os.path.basename(path), _hint(key), key))
    return keys


def verify(public_keys, signature, files, name):
    """The name of the key of `public_keys` (from `load_public_keys`) that signed exactly
    `files` (path: SHA-256 hex) of bundle `name` with `signature`; BundleRefused with the
    reason otherwise."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric import ec

    if not signature:
        raise BundleRefused("the bundle is unsigned")
    try:
        if signature["mediaType"] != BUNDLE_MEDIA_TYPE:
            raise BundleRefused(f"media type {signature['mediaType']!r}, not a model_signing bundle")
        hint = signature["verificationMaterial"]["publicKey"]["hint"]
        envelope = signature["dsseEnvelope"]
        [entry] = envelope["signatures"]
        payload, sig = base64.b64decode(envelope["payload"]), base64.b64decode(entry["sig"])
    except BundleRefused:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise BundleRefused(f"the signature is not a model_signing key signature: {e!r}") from None
    named = [key for key in public_keys if key[1] == hint]
    if not named:
        raise BundleRefused(f"signed with the key whose PEM has SHA-256 {hint}, which is none of the keys trusted")
    key_name, _, key = named[0]
    try:
        key.verify(sig, _pae(payload), ec.ECDSA(_hash_of(key.curve)))
    except InvalidSignature:
        raise BundleRefused(f"the statement is not what key {key_name} signed") from None
    try:
        signed = json.loads(payload)
        if signed["_type"] != STATEMENT_TYPE or signed["predicateType"] != PREDICATE_TYPE:
            raise BundleRefused("the signed statement is not model_signing's")
        resources = {r["name"]: r["digest"] for r in signed["predicate"]["resources"] if r["algorithm"] == "sha256"}
        subjects = [subject["name"] for subject in signed["subject"]]
    except BundleRefused:
        raise
    except (KeyError, TypeError, ValueError) as e:
        raise BundleRefused(f"the signed statement is not model_signing's: {e!r}") from None
    if subjects != [name]:
        raise BundleRefused(f"it was signed as {', '.join(map(repr, subjects)) or 'nothing'}, not {name!r}")
    unsigned = sorted(set(files) - set(resources))
    missing = sorted(set(resources) - set(files))
    if unsigned or missing:
        raise BundleRefused(f"the bundle's files are not those signed: unsigned {unsigned[:5]}, missing {missing[:5]}")
    for path, digest in files.items():
        if resources[path] != digest:
            raise BundleRefused(f"file {path!r} has SHA-256 {digest}, not the {resources[path]} it was signed with")
    return key_name
