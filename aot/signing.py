"""Signing: sign an artifact file, and verify its signature, with OpenSSF's
``model-signing`` (``pip install 'aot[signing]'``).

Key-based and offline: an elliptic-curve private key (PEM; P-256, P-384 or P-521)
signs the whole file's SHA-256 into a Sigstore bundle (``<artifact>.sig`` by default);
the matching public key verifies it. :func:`verify` returns the SHA-256 that the
signature vouches for, so a loader can pin it (``aot.load(..., verify=KEY)`` does):
the bytes then parsed are the bytes that were signed, even if the file changes
between the check and the read. ``model_signing`` is imported only here, and only
when called; every error it raises comes out as an ``ArtifactError``.

Keys: :func:`keygen` (``aot keygen``), or OpenSSL::

    openssl ecparam -name prime256v1 -genkey -noout -out key.pem
    openssl ec -in key.pem -pubout -out key.pub
"""

from __future__ import annotations

import base64
import json
import os
import tempfile

from .errors import ArtifactError

__all__ = ["sign", "verify", "keygen", "default_signature_path"]

_INSTALL = "pip install 'aot[signing]'"
_KEYS = "an elliptic-curve (P-256, P-384 or P-521)"


def default_signature_path(artifact_path: str) -> str:
    """``<artifact>.sig``: where :func:`sign` writes and :func:`verify` looks by default."""
    return os.fspath(artifact_path) + ".sig"


def sign(artifact_path: str, private_key: str, signature_path: str | None = None, *,
         password: str | bytes | None = None) -> str:
    """Sign the artifact file at ``artifact_path`` with the elliptic-curve private key
    (PEM file) ``private_key``; returns the signature's path (default ``<artifact>.sig``).

    The file must be a valid artifact (``aot.artifact.load_artifact``): a corrupt file
    is refused, not signed.

    Raises:
        ArtifactError: not a valid artifact; an unreadable, encrypted (no or wrong
            ``password``) or unsupported key; ``model-signing`` not installed.
    """
    from .artifact import load_artifact
    load_artifact(artifact_path)
    signature_path = signature_path or default_signature_path(artifact_path)
    _need_file(private_key, "private key", "sign")
    signing = _model_signing("signing", "sign")
    if isinstance(password, str):
        password = password.encode()
    try:
        config = signing.Config().use_elliptic_key_signer(private_key=private_key,
                                                          password=password)
    except Exception as e:  # the library's errors: ValueError, TypeError, OSError...
        raise ArtifactError(f"cannot sign {artifact_path!r}: the private key {private_key!r} "
                            f"is not usable ({_what(e)}): expected {_KEYS} private key in "
                            "PEM, and its password if it is encrypted", stage="sign") from e
    try:
        config.sign(artifact_path, signature_path)
    except Exception as e:
        raise ArtifactError(f"cannot sign {artifact_path!r} with {private_key!r}: "
                            f"{_what(e)}", stage="sign") from e
    return signature_path


def verify(artifact_path: str, public_key: str, signature_path: str | None = None) -> str:
    """Check that ``signature_path`` (default ``<artifact>.sig``) is a signature of the
    file at ``artifact_path`` by the private key matching ``public_key`` (PEM file).

    Returns:
        The SHA-256 (hex) of the file the signature vouches for: pin it
        (``load_artifact(path, sha256=...)``) to parse only those bytes.
    Raises:
        ArtifactError: no signature file; a signature by another key, forged or
            damaged; a file that is not the one signed; an unreadable or unsupported
            public key; ``model-signing`` not installed.
    """
    signature_path = signature_path or default_signature_path(artifact_path)
    _need_file(artifact_path, "artifact")
    _need_file(public_key, "public key")
    if not os.path.isfile(signature_path):
        raise ArtifactError(f"{artifact_path!r} has no signature: {signature_path!r} does not "
                            "exist (sign the artifact with `aot sign`, or give the signature's "
                            "path)", stage="load")
    with open(signature_path, "rb") as f:
        bundle = f.read()
    verifying = _model_signing("verifying")
    try:
        config = verifying.Config().use_elliptic_key_verifier(public_key=public_key)
    except Exception as e:
        raise ArtifactError(f"the public key {public_key!r} is not usable ({_what(e)}): "
                            f"expected {_KEYS} public key in PEM", stage="load") from e
    # the library reads the signature by path: hand it a private copy, so the bundle it
    # checks is the one whose digest is returned
    fd, copy = tempfile.mkstemp(suffix=".sig")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(bundle)
        config.verify(artifact_path, copy)
    except Exception as e:
        raise ArtifactError(f"{artifact_path!r}: signature {signature_path!r} does not verify "
                            f"with {public_key!r}: {_verify_problem(e)}", stage="load") from e
    finally:
        os.unlink(copy)
    return _signed_sha256(bundle, artifact_path, signature_path)


def keygen(private_path: str, public_path: str | None = None) -> tuple[str, str]:
    """Write a new P-256 key pair: the private key (PEM, unencrypted, mode 0600) to
    ``private_path``, the public key to ``public_path`` (default ``<private>.pub``, or
    ``key.pub`` for ``key.pem``). Refuses to overwrite either file.

    Returns:
        ``(private_path, public_path)``.
    Raises:
        ArtifactError: a file exists already or cannot be written; ``cryptography``
            (installed with ``model-signing``) missing.
    """
    if public_path is None:
        stem, ext = os.path.splitext(private_path)
        public_path = (stem if ext == ".pem" else private_path) + ".pub"
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec
    except ImportError as e:
        raise ArtifactError(f"making keys needs the signing extra: {_INSTALL}",
                            stage="sign") from e
    for p in (private_path, public_path):
        if os.path.exists(p):
            raise ArtifactError(f"{p!r} exists already: not overwriting a key", stage="sign")
    key = ec.generate_private_key(ec.SECP256R1())
    private = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(private)
        with open(public_path, "xb") as f:
            f.write(public)
    except OSError as e:
        raise ArtifactError(f"cannot write the key pair: {e}", stage="sign") from e
    return private_path, public_path


def _model_signing(module: str, stage: str = "load"):
    try:
        import importlib
        return importlib.import_module(f"model_signing.{module}")
    except ImportError as e:  # model_signing itself, or what it imports (OpenSSL)
        raise ArtifactError(f"signing and verifying artifacts needs model-signing "
                            f"({e}): {_INSTALL}", stage=stage) from e


def _need_file(path: str, what: str, stage: str = "load") -> None:
    if not os.path.isfile(path):
        raise ArtifactError(f"no {what} file {path!r}", stage=stage)


def _what(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _verify_problem(e: BaseException) -> str:
    """The library's error, in words: which check failed."""
    text = str(e)
    name = type(e).__name__
    if "Signature mismatch" in text or "Hash mismatch" in text:
        return ("the artifact is not the file that was signed (changed after signing, or "
                "the signature is another file's)")
    if "Key mismatch" in text or name == "InvalidSignature":
        return "the signature was not made with the private key of this public key"
    return f"not a valid signature ({_what(e)})"


def _signed_sha256(bundle: bytes, artifact_path: str, signature_path: str) -> str:
    """The SHA-256 a verified signature of one file vouches for (its one resource)."""
    try:
        payload = json.loads(base64.b64decode(json.loads(bundle)["dsseEnvelope"]["payload"]))
        (resource,) = payload["predicate"]["resources"]
        algorithm, digest = resource["algorithm"], resource["digest"]
    except (ValueError, KeyError, TypeError) as e:
        raise ArtifactError(f"{artifact_path!r}: signature {signature_path!r} is not a "
                            f"signature of one file ({_what(e)}): sign it with `aot sign`",
                            stage="load") from e
    if algorithm != "sha256" or not isinstance(digest, str) or len(digest) != 64:
        raise ArtifactError(f"{artifact_path!r}: signature {signature_path!r} uses "
                            f"{algorithm!r}, not SHA-256: sign it with `aot sign`",
                            stage="load")
    return digest.lower()
