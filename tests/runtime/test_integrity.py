"""Integrity a user can require: a pinned whole-file SHA-256, a refusal of the legacy
formats, and signatures (model-signing, elliptic-curve keys, offline): every refusal
is an ArtifactError, and happens before the file is parsed."""

import hashlib
import json
import os
import stat
import struct
import subprocess
import sys

import pytest
import torch

import aot
from aot import artifact
from aot.artifact import file_sha256

try:
    import model_signing.signing  # noqa: F401 (and the OpenSSL it imports)
    HAS_SIGNING = True
except ImportError:
    HAS_SIGNING = False
# the test extra installs it: `pip install -e '.[test]'`
needs_signing = pytest.mark.skipif(not HAS_SIGNING, reason="pip install 'aot[signing]'")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOL = {"rtol": 1e-5, "atol": 1e-5}  # compiled Linear vs eager, float32


@pytest.fixture(scope="module")
def art(tmp_path_factory):
    """``(path, model, x)``: a tiny artifact, compiled once for the module."""
    torch.manual_seed(0)
    m, x = torch.nn.Linear(4, 4).eval(), torch.randn(2, 4)
    path = str(tmp_path_factory.mktemp("integrity") / "lin.aot")
    aot.compile(m, (x,), placement="coverage").save(path)
    return path, m, x


def _keys(where, name="key", password=None):
    """``(private.pem, public.pem)`` paths of a new P-256 key pair (made with
    ``cryptography``, which model-signing brings: no openssl binary, no network)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    key = ec.generate_private_key(ec.SECP256R1())
    enc = serialization.BestAvailableEncryption(password) if password else \
        serialization.NoEncryption()
    private, public = str(where / f"{name}.pem"), str(where / f"{name}.pub")
    with open(private, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM,
                                  serialization.PrivateFormat.PKCS8, enc))
    with open(public, "wb") as f:
        f.write(key.public_key().public_bytes(serialization.Encoding.PEM,
                                              serialization.PublicFormat.SubjectPublicKeyInfo))
    return private, public


@pytest.fixture(scope="module")
def signed(art, tmp_path_factory):
    """``(artifact path, private key, public key)``: the artifact signed at ``<path>.sig``."""
    from aot.signing import sign
    where = tmp_path_factory.mktemp("signed")
    path = str(where / "lin.aot")
    with open(art[0], "rb") as src, open(path, "wb") as dst:
        dst.write(src.read())
    private, public = _keys(where)
    assert sign(path, private) == path + ".sig"
    return path, private, public


def _copy(path, dst, edit=lambda data: data):
    with open(path, "rb") as f:
        data = f.read()
    with open(dst, "wb") as f:
        f.write(edit(data))
    return str(dst)


def _manifest_span(data: bytes) -> tuple[int, int]:
    """(start, end) of the manifest bytes in a version-3 file."""
    pos = 7 + 4 + 32
    (n,) = struct.unpack_from("<Q", data, pos)
    return pos + 8, pos + 8 + n


def _edited(path, dst):
    """The artifact with its manifest's ``name`` changed and the internal digest recomputed:
    a well-formed file the keyless checksum cannot tell from the original."""
    def edit(data):
        start, end = _manifest_span(data)
        manifest = json.loads(data[start:end])
        manifest["name"] = manifest["name"] + "-edited"
        body = json.dumps(manifest).encode()
        rest = struct.pack("<Q", len(body)) + body + data[end:]
        return data[:11] + hashlib.sha256(rest).digest() + rest
    return _copy(path, dst, edit)


def _assert_runs_as_eager(cm, m, x):
    torch.testing.assert_close(cm(x), m(x), **TOL)


# -- a pinned digest ---------------------------------------------------------------------

def test_file_sha256_is_the_sha256_of_the_bytes_on_disk(art):
    with open(art[0], "rb") as f:
        data = f.read()
    assert file_sha256(art[0]) == hashlib.sha256(data).hexdigest() == file_sha256(data)


@pytest.mark.parametrize("case", [str.lower, str.upper], ids=["lower", "upper"])
def test_the_right_pin_loads_and_runs_as_eager(art, case):
    path, m, x = art
    cm = aot.load(path, sha256=case(file_sha256(path)))
    _assert_runs_as_eager(cm, m, x)


def test_a_wrong_pin_is_refused_naming_both_digests(art):
    path = art[0]
    wrong = hashlib.sha256(b"another build").hexdigest()
    with pytest.raises(aot.ArtifactError, match="not the pinned file") as e:
        aot.load(path, sha256=wrong)
    assert file_sha256(path)[:16] in str(e.value) and wrong[:16] in str(e.value)


@pytest.mark.parametrize("pin", ["abc", "g" * 64, "0" * 63, "0" * 65, " " + "0" * 63,
                                 "sha256:" + "0" * 64, 12345],
                         ids=["short", "non-hex", "63", "65", "space", "prefixed", "int"])
def test_a_malformed_pin_is_refused(art, pin):
    with pytest.raises(aot.ArtifactError, match="is not a SHA-256 digest"):
        aot.load(art[0], sha256=pin)


def test_a_pinned_file_with_one_byte_changed_is_refused(art, tmp_path):
    path = art[0]
    pin = file_sha256(path)
    for i in (0, 20, os.path.getsize(path) // 2, os.path.getsize(path) - 1):  # magic..vmfb
        bad = _copy(path, tmp_path / "bad.aot",
                    lambda d: d[:i] + bytes([d[i] ^ 0x01]) + d[i + 1:])
        with pytest.raises(aot.ArtifactError, match="not the pinned file"):
            aot.load(bad, sha256=pin)


def test_a_wrong_pin_is_refused_before_the_file_is_parsed(art, tmp_path, monkeypatch):
    """Not an artifact at all: the pin, not the magic bytes, refuses it; and no section
    of a real artifact is read when the pin does not match."""
    junk = _copy(art[0], tmp_path / "junk.aot", lambda d: b"#!/bin/sh\n" + d)
    with pytest.raises(aot.ArtifactError, match="not the pinned file"):
        aot.load(junk, sha256=file_sha256(art[0]))

    def parsed(*a, **k):
        raise AssertionError("a section was parsed")
    monkeypatch.setattr(artifact, "_read_section", parsed)
    with pytest.raises(aot.ArtifactError, match="not the pinned file"):
        aot.load(art[0], sha256="0" * 64)


# -- legacy formats ----------------------------------------------------------------------

def _version2(path, dst):
    """The artifact rewritten as format version 2: magic, u32 version, u64 manifest
    length, manifest, u64 constants length, constants, vmfb (no whole-file digest)."""
    def edit(data):
        start, end = _manifest_span(data)
        manifest = json.loads(data[start:end])
        manifest["format_version"] = 2
        body = json.dumps(manifest).encode()
        return (data[:7] + struct.pack("<I", 2) + struct.pack("<Q", len(body)) + body
                + data[end:])  # constants section and vmfb as they were
    return _copy(path, dst, edit)


def test_legacy_false_refuses_a_version_2_file_which_loads_by_default(art, tmp_path):
    path, m, x = art
    old = _version2(path, tmp_path / "v2.aot")
    with pytest.raises(aot.ArtifactError, match="legacy format version 2.*no whole-file "
                                                "digest"):
        aot.load(old, legacy=False)
    _assert_runs_as_eager(aot.load(old), m, x)  # legacy=True, the default
    _assert_runs_as_eager(aot.load(old, legacy=True), m, x)
    # pinning a legacy file is the user's own whole-file digest: allowed
    _assert_runs_as_eager(aot.load(old, sha256=file_sha256(old)), m, x)


def test_legacy_false_loads_a_version_3_file(art):
    path, m, x = art
    _assert_runs_as_eager(aot.load(path, legacy=False), m, x)


# -- signatures --------------------------------------------------------------------------

@needs_signing
def test_a_signed_artifact_verifies_and_runs_as_eager(signed, art):
    path, _, public = signed
    _, m, x = art
    assert os.path.isfile(path + ".sig")
    _assert_runs_as_eager(aot.load(path, verify=public), m, x)
    from aot.signing import verify
    assert verify(path, public) == file_sha256(path)


@needs_signing
def test_a_signature_elsewhere_and_with_a_pin(signed, art, tmp_path):
    from aot.signing import sign
    path, private, public = signed
    _, m, x = art
    sig = str(tmp_path / "elsewhere.sig")
    assert sign(path, private, sig) == sig
    pin = file_sha256(path)
    _assert_runs_as_eager(aot.load(path, verify=public, signature=sig, sha256=pin.upper()),
                          m, x)
    other = hashlib.sha256(b"other").hexdigest()
    with pytest.raises(aot.ArtifactError, match="vouches for a file with SHA-256") as e:
        aot.load(path, verify=public, sha256=other)
    assert pin[:16] in str(e.value) and other[:16] in str(e.value)
    with pytest.raises(aot.ArtifactError, match="is not a SHA-256 digest"):
        aot.load(path, verify=public, sha256="xyz")


@needs_signing
def test_a_signature_by_another_key_is_refused(signed, tmp_path):
    path = signed[0]
    _, stranger = _keys(tmp_path, "stranger")
    with pytest.raises(aot.ArtifactError, match="not made with the private key"):
        aot.load(path, verify=stranger)


@needs_signing
def test_a_modified_artifact_is_refused_by_its_signature(signed, art, tmp_path):
    """A hand-edited manifest with the internal digest recomputed loads without a check
    (the keyless checksum catches corruption, not tampering), not with one."""
    path, _, public = signed
    bad = _edited(path, tmp_path / "lin.aot")
    _copy(path + ".sig", tmp_path / "lin.aot.sig")
    assert aot.load(bad).manifest["name"].endswith("-edited")
    with pytest.raises(aot.ArtifactError, match="not the file that was signed"):
        aot.load(bad, verify=public)


@needs_signing
def test_the_verified_bytes_are_the_parsed_bytes(signed, tmp_path, monkeypatch):
    """The file swapped for an edited one right after its signature verified: the load
    pins what verified, and refuses what it then reads."""
    import aot.signing
    path, _, public = signed
    work = _copy(path, tmp_path / "lin.aot")
    _copy(path + ".sig", tmp_path / "lin.aot.sig")
    edited = _edited(path, tmp_path / "edited.aot")
    real = aot.signing.verify

    def verify_then_swap(*a, **k):
        digest = real(*a, **k)
        os.replace(edited, work)
        return digest
    monkeypatch.setattr(aot.signing, "verify", verify_then_swap)
    with pytest.raises(aot.ArtifactError, match="not the pinned file"):
        aot.load(work, verify=public)


@needs_signing
def test_a_missing_signature_is_refused(art, tmp_path):
    path = _copy(art[0], tmp_path / "unsigned.aot")
    _, public = _keys(tmp_path)
    with pytest.raises(aot.ArtifactError, match="has no signature.*unsigned.aot.sig"):
        aot.load(path, verify=public)


@needs_signing
@pytest.mark.parametrize("content", [b"", b"not json", b'{"mediaType": 1}',
                                     b'{"dsseEnvelope": {"payload": "!!"}}'],
                         ids=["empty", "text", "no-envelope", "bad-payload"])
def test_a_garbage_signature_is_an_artifact_error(signed, tmp_path, content):
    path, _, public = signed
    sig = str(tmp_path / "garbage.sig")
    with open(sig, "wb") as f:
        f.write(content)
    with pytest.raises(aot.ArtifactError, match="does not verify"):
        aot.load(path, verify=public, signature=sig)


@needs_signing
def test_an_unusable_public_key_is_an_artifact_error(signed, tmp_path):
    path = signed[0]
    bad = str(tmp_path / "bad.pub")
    with open(bad, "w") as f:
        f.write("-----BEGIN PUBLIC KEY-----\nnonsense\n-----END PUBLIC KEY-----\n")
    with pytest.raises(aot.ArtifactError, match="public key .*bad.pub' is not usable"):
        aot.load(path, verify=bad)
    with pytest.raises(aot.ArtifactError, match="no public key file"):
        aot.load(path, verify=str(tmp_path / "absent.pub"))


@needs_signing
def test_signature_without_verify_is_refused(signed):
    with pytest.raises(aot.ArtifactError, match="only with verify"):
        aot.load(signed[0], signature=signed[0] + ".sig")


@needs_signing
def test_sign_refuses_a_corrupt_file_and_a_bad_key(art, tmp_path):
    from aot.signing import sign
    private, _ = _keys(tmp_path)
    bad = _copy(art[0], tmp_path / "bad.aot", lambda d: d[:-1] + bytes([d[-1] ^ 1]))
    with pytest.raises(aot.ArtifactError, match="corrupt"):
        sign(bad, private)
    assert not os.path.exists(bad + ".sig")
    good = _copy(art[0], tmp_path / "good.aot")
    with pytest.raises(aot.ArtifactError, match="no private key file"):
        sign(good, str(tmp_path / "absent.pem"))
    _, public = _keys(tmp_path, "pub")
    with pytest.raises(aot.ArtifactError, match=r"\[sign\].*private key .* is not usable"):
        sign(good, public)  # a public key is no private key


@needs_signing
def test_an_encrypted_private_key_signs_with_its_password(art, tmp_path):
    from aot.signing import sign
    path = _copy(art[0], tmp_path / "lin.aot")
    private, public = _keys(tmp_path, password=b"s3cret")
    with pytest.raises(aot.ArtifactError, match="cannot sign"):
        sign(path, private)
    sign(path, private, password="s3cret")
    assert aot.load(path, verify=public).manifest == aot.load(path).manifest


@needs_signing
def test_without_model_signing_the_error_says_what_to_install(signed, monkeypatch):
    monkeypatch.setitem(sys.modules, "model_signing.verifying", None)  # import fails
    with pytest.raises(aot.ArtifactError, match=r"pip install 'aot\[signing\]'"):
        aot.load(signed[0], verify=signed[2])


@needs_signing
def test_keygen_writes_a_working_pair_and_never_overwrites(art, tmp_path):
    from aot.signing import keygen, sign
    private, public = keygen(str(tmp_path / "k.pem"))
    assert public == str(tmp_path / "k.pub")
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    path = _copy(art[0], tmp_path / "lin.aot")
    sign(path, private)
    assert aot.load(path, verify=public).manifest["name"]
    with pytest.raises(aot.ArtifactError, match="exists already"):
        keygen(private)


# -- the command line --------------------------------------------------------------------

def _aot(*args, cwd):
    return subprocess.run([sys.executable, "-m", "aot.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=600,
                          env={**os.environ, "PYTHONPATH": ROOT})


@needs_signing
def test_cli_compile_keygen_sign_then_run_verified(tmp_path):
    src = tmp_path / "tiny.py"
    src.write_text("import torch\n"
                   "def make():\n"
                   "    torch.manual_seed(0)\n"
                   "    return torch.nn.Linear(4, 4).eval(), (torch.randn(2, 4),)\n")
    done = _aot("compile", f"{src}:make", "--placement", "coverage", "-o", "m.aot",
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    digest = file_sha256(str(tmp_path / "m.aot"))
    assert f"sha256: {digest}" in done.stdout.splitlines()
    done = _aot("keygen", "key.pem", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "key.pem").is_file() and (tmp_path / "key.pub").is_file()
    done = _aot("sign", "m.aot", "--key", "key.pem", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "m.aot.sig").is_file() and "m.aot.sig" in done.stderr
    done = _aot("run", "m.aot", "--verify", "key.pub", "--sha256", digest, "--repeat", "1",
                cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "output 0: float32[2, 4]" in done.stdout
    _keys(tmp_path, "stranger")
    done = _aot("run", "m.aot", "--verify", "stranger.pub", cwd=tmp_path)
    assert done.returncode == 1
    assert "ArtifactError" in done.stderr and "not made with the private key" in done.stderr


@needs_signing
def test_cli_report_prints_the_digest_and_checks_what_it_is_given(signed, tmp_path, capsys):
    from aot.cli import main
    path, private, public = signed
    assert main(["report", path]) == 0
    out = capsys.readouterr().out
    assert f"sha256: {file_sha256(path)}" in out.splitlines()
    assert main(["report", path, "--sha256", file_sha256(path), "--verify", public,
                 "--no-legacy"]) == 0
    assert "sha256:" in capsys.readouterr().out
    assert main(["report", path, "--sha256", "0" * 64]) == 1
    assert "not the pinned file" in capsys.readouterr().err
    sig = str(tmp_path / "s.sig")
    assert main(["sign", path, "--key", private, "--signature", sig]) == 0
    assert os.path.isfile(sig)
    capsys.readouterr()
    assert main(["report", path, "--verify", public, "--signature",
                 str(tmp_path / "none.sig")]) == 1
    assert "has no signature" in capsys.readouterr().err
    old = _version2(path, tmp_path / "v2.aot")
    assert main(["report", old]) == 0
    capsys.readouterr()
    assert main(["report", old, "--no-legacy"]) == 1
    assert "legacy format version 2" in capsys.readouterr().err
