"""``fleetctl``: the operator's command line.

Commands are grouped (``fleetctl bundle init``); each group adds its sub-parsers in one
``_add_<group>`` function and each command is a ``cmd_<group>_<action>`` function taking
the parsed arguments and returning an exit code. The library raises; this module turns
:class:`agent.errors.AgentError` and :class:`fleet_server.errors.FleetError` into one line
on stderr and exit code 2. Passphrases never come from arguments: see
docs/keys-and-repository.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from agent.bundle import Bundle, init_bundle
from agent.errors import AgentError
from agent.wire.manifest import MANIFEST_NAME, ClassificationPost, ScorePost, write_durable
from agent.wire.postprocess import POSTPROCESS_KINDS
from fleet_server.errors import FleetError
from fleet_server.repository import (
    ROLES,
    KeyStore,
    Passphrases,
    PublishedBundle,
    Repository,
    build_bundle,
    issue_directive,
)
from fleet_server.repository.keys import DEFAULT_PASSPHRASE_NAME
from runtime.cli import parse_shape

EXIT_ERROR = 2

_BUNDLE_INIT_EXAMPLE = """\
example:
  fleetctl bundle init models/text_cls.onnx --out bundles/text-cls \\
      --name text-cls --version 1.0.0 --input-shape 1x3x48x192

Reads the input's name, shape and dtype from the model and writes DIR/manifest.json with
defaults to edit (preprocessing mean/std and colour order, postprocess labels and
thresholds, policy, profiles, latency budget). Schema: docs/bundle-manifest.md.
"""


def _describe(bundle: Bundle) -> list[str]:
    m = bundle.manifest
    pre, post = m.preprocess, m.postprocess
    lines = [
        f"  bundle      {m.name} {m.version} (release {m.release})",
        f"  digest      {bundle.digest}",
    ]
    lines += [f"  model       {fmt}: {v.file} ({v.size} bytes)" for fmt, v in m.models.items()]
    shape = "x".join(str(d) for d in m.input.shape)
    how = f" ({pre.layout}, {pre.color})" if pre is not None else " (tensor, no preprocessing)"
    lines.append(f"  input       '{m.input.name}' {shape} {m.input.dtype}{how}")
    if isinstance(post, ClassificationPost):
        detail = f"top_k={post.top_k}"
    elif isinstance(post, ScorePost):
        detail = f"index={post.index}"
    else:
        detail = f"format={post.format} threshold={post.threshold}"
    lines.append(f"  postprocess {post.kind} {detail} on output '{post.output}'")
    return lines


def cmd_bundle_init(args: argparse.Namespace) -> int:
    bundle = init_bundle(
        args.model,
        args.out,
        name=args.name,
        version=args.version,
        input_shape=args.input_shape,
        postprocess=args.postprocess,
    )
    manifest_path = bundle.path / MANIFEST_NAME
    if args.json:
        report: dict[str, Any] = {
            "manifest": str(manifest_path),
            "digest": bundle.digest,
            "bundle": bundle.manifest.model_dump(mode="json"),
        }
        print(json.dumps(report, indent=2))
        return 0
    print(f"wrote {manifest_path}")
    print("\n".join(_describe(bundle)))
    print("edit preprocessing, postprocess, policy and profiles in the manifest as needed")
    return 0


def _add_bundle(commands: Any) -> None:
    bundle = commands.add_parser(
        "bundle",
        help="model bundles",
        description="Create, build, publish, verify and list model bundles.",
    )
    actions = bundle.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = actions.add_parser(
        "init",
        help="write a new bundle for an ONNX or TFLite image model",
        description="Write a new model bundle (model file + manifest.json) into DIR.",
        epilog=_BUNDLE_INIT_EXAMPLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    init.add_argument("model", type=Path, metavar="MODEL", help="the .onnx or .tflite file")
    init.add_argument(
        "--out", required=True, type=Path, metavar="DIR", help="new (or empty) bundle directory"
    )
    init.add_argument("--name", help="bundle name (default: from the model file name)")
    init.add_argument("--version", default="0.1.0", help="semantic version (default: 0.1.0)")
    init.add_argument(
        "--input-shape",
        type=parse_shape,
        metavar="SHAPE",
        help="concrete input shape for a model with dynamic dimensions, e.g. 1x3x640x640",
    )
    init.add_argument(
        "--postprocess",
        choices=POSTPROCESS_KINDS,
        help="post-processing to start from (default: guessed from the first output)",
    )
    init.add_argument("--json", action="store_true", help="print the result as JSON")
    init.set_defaults(func=cmd_bundle_init)
    _add_bundle_repo_actions(actions)


# -- keys, repo, bundle build/publish/verify/list, directive ----------------------

_PASSPHRASE_HELP = (
    "passphrases are read from $NAME_<ROLE> or $NAME (NAME: --passphrase-name, default "
    f"{DEFAULT_PASSPHRASE_NAME}), each first as a file in $CREDENTIALS_DIRECTORY, then "
    "from the environment; never from the command line"
)
_DURATION = re.compile(r"^([1-9][0-9]*)([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_duration(text: str) -> timedelta:
    """``"7d"``, ``"12h"``, ``"30m"`` or ``"90s"`` as a timedelta (argparse type)."""
    m = _DURATION.match(text.strip())
    if m is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 7d, 12h, 30m or 90s")
    return timedelta(**{_UNITS[m.group(2)]: int(m.group(1))})


def _keystore(args: argparse.Namespace) -> KeyStore:
    return KeyStore(args.keystore, Passphrases(args.passphrase_name))


def _emit(args: argparse.Namespace, data: Any, lines: list[str]) -> int:
    print(json.dumps(data, indent=2) if args.json else "\n".join(lines))
    return 0


def cmd_keys_init(args: argparse.Namespace) -> int:
    store = KeyStore.create(
        args.keystore,
        root_keys=args.root_keys,
        root_threshold=args.root_threshold,
        passphrases=Passphrases(args.passphrase_name),
    )
    return _emit_keys(args, store, f"created keystore {store.path}")


def _emit_keys(args: argparse.Namespace, store: KeyStore, title: str = "") -> int:
    keys = store.list_keys(include_retired=getattr(args, "all", False))
    lines = [title] if title else []
    lines.append(f"root threshold {store.root_threshold}")
    lines += [
        f"  {k.role:<9} {k.keyid}  {k.path.name}" + (f"  retired {k.retired}" if k.retired else "")
        for k in keys
    ]
    data = {"root_threshold": store.root_threshold, "keys": [k.to_dict() for k in keys]}
    return _emit(args, data, lines)


def cmd_keys_list(args: argparse.Namespace) -> int:
    return _emit_keys(args, _keystore(args))


def cmd_keys_rotate(args: argparse.Namespace) -> int:
    repo = Repository(args.repo)
    new = repo.rotate(args.role, _keystore(args))
    root = repo.root().signed.version
    lines = [f"rotated {args.role}: new key(s) {', '.join(new)}; root is now v{root}"]
    return _emit(args, {"role": args.role, "keyids": new, "root_version": root}, lines)


def cmd_repo_init(args: argparse.Namespace) -> int:
    repo = Repository(args.repo)
    repo.init(_keystore(args))
    lines = [f"created repository {repo.path} (root v1, targets v1, snapshot v1, timestamp v1)"]
    return _emit(args, {"repo": str(repo.path), "root_version": 1}, lines)


def cmd_repo_refresh(args: argparse.Namespace) -> int:
    repo = Repository(args.repo)
    store = _keystore(args)
    if args.timestamp_only:
        repo.refresh_timestamp(store)
        renewed = ["timestamp"]
    else:
        renewed = repo.refresh(store)
    expiries = {
        role: md.signed.expires.isoformat()
        for role, md in (
            ("root", repo.root()),
            ("targets", repo.targets()),
            ("snapshot", repo.snapshot()),
            ("timestamp", repo.timestamp()),
        )
    }
    lines = [f"re-signed {', '.join(renewed)}"] + [
        f"  {r:<9} expires {e}" for r, e in expiries.items()
    ]
    return _emit(args, {"renewed": renewed, "expires": expiries}, lines)


def _bundle_lines(b: PublishedBundle) -> list[str]:
    profiles = ", ".join(b.profiles) or "any profile"
    lines = [f"{b.name} {b.version} release {b.release} ({profiles}; published {b.published})"]
    return lines + [f"  {f.file}  {f.length} bytes  sha256 {f.sha256}" for f in b.files]


def cmd_bundle_build(args: argparse.Namespace) -> int:
    manifest = build_bundle(args.dir, release=args.release, version=args.version)
    lines = [f"updated {args.dir / MANIFEST_NAME}: {manifest.name} {manifest.version} "
             f"release {manifest.release}"]  # fmt: skip
    lines += [f"  {v.file}  {v.size} bytes  sha256 {v.sha256}" for v in manifest.models.values()]
    return _emit(args, manifest.model_dump(mode="json"), lines)


def cmd_bundle_publish(args: argparse.Namespace) -> int:
    published = Repository(args.repo).publish(args.dir, _keystore(args))
    return _emit(args, published.to_dict(), ["published", *_bundle_lines(published)])


def cmd_bundle_verify(args: argparse.Namespace) -> int:
    bundle = Repository(args.repo).verify(args.dir)
    return _emit(args, bundle.to_dict(), ["ok: matches the signed release", *_bundle_lines(bundle)])


def cmd_bundle_list(args: argparse.Namespace) -> int:
    bundles = Repository(args.repo).bundles(args.name)
    lines = [line for b in bundles for line in _bundle_lines(b)] or ["no bundles published"]
    return _emit(args, [b.to_dict() for b in bundles], lines)


def cmd_directive_issue(args: argparse.Namespace) -> int:
    data = issue_directive(
        Repository(args.repo),
        _keystore(args),
        args.device,
        args.hardware_class,
        args.bundle,
        args.release,
        counter=args.counter,
        expires_in=args.expires_in,
    )
    if args.out is None:
        sys.stdout.write(data.decode() + "\n")
        return 0
    try:
        write_durable(args.out, data)
    except OSError as exc:
        raise FleetError(f"cannot write {args.out}: {exc}") from exc
    print(f"wrote {args.out}")
    return 0


def _command(actions: Any, name: str, help_: str, example: str, func: Any) -> Any:
    parser = actions.add_parser(
        name,
        help=help_,
        description=help_[0].upper() + help_[1:] + ".",
        epilog=f"example:\n  {example}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.set_defaults(func=func)
    return parser


def _opts(parser: Any, *, repo: bool = False, keystore: bool = False, json_: bool = True) -> None:
    if repo:
        parser.add_argument("--repo", required=True, type=Path, metavar="DIR", help="repository")
    if keystore:
        parser.add_argument("--keystore", required=True, type=Path, metavar="DIR", help="keys")
        parser.add_argument(
            "--passphrase-name",
            default=DEFAULT_PASSPHRASE_NAME,
            metavar="NAME",
            help=_PASSPHRASE_HELP,
        )
    if json_:
        parser.add_argument("--json", action="store_true", help="print the result as JSON")


def _add_keys(commands: Any) -> None:
    group = commands.add_parser("keys", help="signing keys", description="Manage signing keys.")
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = _command(
        actions, "init", "generate a keystore: root keys and one key per other role",
        "EDGEFLEET_KEY_PASSPHRASE_ROOT=... EDGEFLEET_KEY_PASSPHRASE=... "
        "fleetctl keys init --keystore keys --root-keys 3 --root-threshold 2",
        cmd_keys_init,
    )  # fmt: skip
    _opts(init, keystore=True)
    init.add_argument("--root-keys", type=int, default=3, metavar="N", help="default: 3")
    init.add_argument("--root-threshold", type=int, default=2, metavar="T", help="default: 2")
    listing = _command(
        actions, "list", "list keys: role, key id, file (no passphrase needed)",
        "fleetctl keys list --keystore keys --json", cmd_keys_list,
    )  # fmt: skip
    _opts(listing, keystore=True)
    listing.add_argument("--all", action="store_true", help="include retired keys")
    rotate = _command(
        actions, "rotate", "replace a role's keys and publish a new root (or targets)",
        "fleetctl keys rotate root --keystore keys --repo repo", cmd_keys_rotate,
    )  # fmt: skip
    rotate.add_argument("role", choices=ROLES, help="the role whose keys are replaced")
    _opts(rotate, repo=True, keystore=True)


def _add_repo(commands: Any) -> None:
    group = commands.add_parser(
        "repo", help="bundle repository", description="Create and maintain the repository."
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    init = _command(
        actions, "init", "create the repository's first signed metadata from a keystore",
        "fleetctl repo init --repo repo --keystore keys", cmd_repo_init,
    )  # fmt: skip
    _opts(init, repo=True, keystore=True)
    refresh = _command(
        actions, "refresh",
        "re-sign the timestamp, and targets/snapshot when half their validity is gone",
        "fleetctl repo refresh --repo repo --keystore keys   # daily, from a timer",
        cmd_repo_refresh,
    )  # fmt: skip
    _opts(refresh, repo=True, keystore=True)
    refresh.add_argument("--timestamp-only", action="store_true", help="only the timestamp")


def _add_bundle_repo_actions(actions: Any) -> None:
    build = _command(
        actions, "build", "hash the model files into the manifest (sha256, size)",
        "fleetctl bundle build bundles/text-cls --release 2 --version 1.1.0", cmd_bundle_build,
    )  # fmt: skip
    build.add_argument("dir", type=Path, metavar="DIR", help="bundle directory")
    build.add_argument("--release", type=int, metavar="N", help="set manifest.release")
    build.add_argument("--version", metavar="SEMVER", help="set manifest.version")
    _opts(build)
    publish = _command(
        actions, "publish", "sign and publish a bundle (release above any published)",
        "fleetctl bundle publish bundles/text-cls --repo repo --keystore keys",
        cmd_bundle_publish,
    )  # fmt: skip
    publish.add_argument("dir", type=Path, metavar="DIR", help="bundle directory")
    _opts(publish, repo=True, keystore=True)
    verify = _command(
        actions, "verify", "check a bundle directory against what the repository signed",
        "fleetctl bundle verify bundles/text-cls --repo repo", cmd_bundle_verify,
    )  # fmt: skip
    verify.add_argument("dir", type=Path, metavar="DIR", help="bundle directory")
    _opts(verify, repo=True)
    listing = _command(
        actions, "list", "list published bundles",
        "fleetctl bundle list --repo repo --json", cmd_bundle_list,
    )  # fmt: skip
    listing.add_argument("--name", help="only this bundle name")
    _opts(listing, repo=True)


def _add_directive(commands: Any) -> None:
    group = commands.add_parser(
        "directive", help="signed directives", description="Assign bundles to devices."
    )
    actions = group.add_subparsers(dest="action", required=True, metavar="ACTION")
    issue = _command(
        actions, "issue", "sign a directive assigning a published release to one device",
        "fleetctl directive issue --repo repo --keystore keys --device cam-07 \\\n"
        "      --hardware-class jetson-orin --bundle text-cls --release 2 --out d.json",
        cmd_directive_issue,
    )  # fmt: skip
    _opts(issue, repo=True, keystore=True, json_=False)
    issue.add_argument("--device", required=True, metavar="ID", help="device id")
    issue.add_argument("--hardware-class", required=True, metavar="PROFILE", help="profile name")
    issue.add_argument("--bundle", required=True, metavar="NAME", help="bundle name")
    issue.add_argument("--release", required=True, type=int, metavar="N", help="release")
    issue.add_argument("--counter", type=int, metavar="N", help="default: the next one")
    issue.add_argument(
        "--expires-in", type=parse_duration, default=timedelta(days=7), metavar="DURATION",
        help="validity, e.g. 7d, 12h (default: 7d)",
    )  # fmt: skip
    issue.add_argument("--out", type=Path, metavar="FILE", help="write here (default: stdout)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetctl",
        description="Operate an edgefleet fleet: signing keys, the bundle repository, "
        "model bundles and directives.",
        epilog="example:\n  fleetctl bundle init model.onnx --out bundles/my-model\n"
        "  fleetctl bundle publish bundles/my-model --repo repo --keystore keys",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_keys(commands)
    _add_repo(commands)
    _add_bundle(commands)
    _add_directive(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args.func(args)
    except (AgentError, FleetError) as exc:
        message = " ".join(str(exc).split())
        print(f"fleetctl: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
