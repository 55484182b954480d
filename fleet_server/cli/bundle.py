"""``fleetctl bundle init|build|publish|verify|list``: write a model bundle, hash its files
into the manifest, and sign, verify and list it in the TUF repository (see
docs/bundle-manifest.md and docs/keys-and-repository.md)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_server.cli.defaults import POSTPROCESS_KINDS
from fleet_server.cli.repo import add_command, add_options, emit, open_keystore

if TYPE_CHECKING:
    from agent.kernel.bundle import Bundle
    from fleet_server.repository import PublishedBundle

_BUNDLE_INIT_EXAMPLE = """\
example:
  fleetctl bundle init models/text_cls.onnx --out bundles/text-cls \\
      --name text-cls --version 1.0.0 --input-shape 1x3x48x192

Reads the input's name, shape and dtype from the model and writes DIR/manifest.json with
defaults to edit (preprocessing mean/std and colour order, postprocess labels and
thresholds, policy, profiles, latency budget). Schema: docs/bundle-manifest.md.
"""


def parse_shape(text: str) -> tuple[int, ...]:
    """``--input-shape``: :func:`runtime.cli.parse_shape`, imported only when given."""
    from runtime.cli import parse_shape as parse  # noqa: PLC0415 - fleetctl starts light

    return parse(text)


def _describe(bundle: Bundle) -> list[str]:
    from agent.wire.manifest import (  # noqa: PLC0415 - fleetctl starts light
        ClassificationPost,
        ScorePost,
    )

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
    from agent.kernel.bundle import init_bundle  # noqa: PLC0415 - fleetctl starts light
    from agent.wire.manifest import MANIFEST_NAME  # noqa: PLC0415

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


def _bundle_lines(b: PublishedBundle) -> list[str]:
    profiles = ", ".join(b.profiles) or "any profile"
    lines = [f"{b.name} {b.version} release {b.release} ({profiles}; published {b.published})"]
    return lines + [f"  {f.file}  {f.length} bytes  sha256 {f.sha256}" for f in b.files]


def cmd_bundle_build(args: argparse.Namespace) -> int:
    from agent.wire.manifest import MANIFEST_NAME  # noqa: PLC0415 - fleetctl starts light
    from fleet_server.repository import build_bundle  # noqa: PLC0415

    manifest = build_bundle(args.dir, release=args.release, version=args.version)
    lines = [f"updated {args.dir / MANIFEST_NAME}: {manifest.name} {manifest.version} "
             f"release {manifest.release}"]  # fmt: skip
    lines += [f"  {v.file}  {v.size} bytes  sha256 {v.sha256}" for v in manifest.models.values()]
    return emit(args, manifest.model_dump(mode="json"), lines)


def cmd_bundle_publish(args: argparse.Namespace) -> int:
    from fleet_server.repository import Repository  # noqa: PLC0415 - fleetctl starts light

    published = Repository(args.repo).publish(args.dir, open_keystore(args))
    return emit(args, published.to_dict(), ["published", *_bundle_lines(published)])


def cmd_bundle_verify(args: argparse.Namespace) -> int:
    from fleet_server.repository import Repository  # noqa: PLC0415 - fleetctl starts light

    bundle = Repository(args.repo).verify(args.dir)
    return emit(args, bundle.to_dict(), ["ok: matches the signed release", *_bundle_lines(bundle)])


def cmd_bundle_list(args: argparse.Namespace) -> int:
    from fleet_server.repository import Repository  # noqa: PLC0415 - fleetctl starts light

    bundles = Repository(args.repo).bundles(args.name)
    lines = [line for b in bundles for line in _bundle_lines(b)] or ["no bundles published"]
    return emit(args, [b.to_dict() for b in bundles], lines)


def _add_repo_actions(actions: Any) -> None:
    build = add_command(
        actions, "build", "hash the model files into the manifest (sha256, size)",
        "fleetctl bundle build bundles/text-cls --release 2 --version 1.1.0", cmd_bundle_build,
    )  # fmt: skip
    build.add_argument("dir", type=Path, metavar="DIR", help="bundle directory")
    build.add_argument("--release", type=int, metavar="N", help="set manifest.release")
    build.add_argument("--version", metavar="SEMVER", help="set manifest.version")
    add_options(build)
    publish = add_command(
        actions, "publish", "sign and publish a bundle (release above any published)",
        "fleetctl bundle publish bundles/text-cls --repo repo --keystore keys",
        cmd_bundle_publish,
    )  # fmt: skip
    publish.add_argument("dir", type=Path, metavar="DIR", help="bundle directory")
    add_options(publish, repo=True, keystore=True)
    verify = add_command(
        actions, "verify", "check a bundle directory against what the repository signed",
        "fleetctl bundle verify bundles/text-cls --repo repo", cmd_bundle_verify,
    )  # fmt: skip
    verify.add_argument("dir", type=Path, metavar="DIR", help="bundle directory")
    add_options(verify, repo=True)
    listing = add_command(
        actions, "list", "list published bundles",
        "fleetctl bundle list --repo repo --json", cmd_bundle_list,
    )  # fmt: skip
    listing.add_argument("--name", help="only this bundle name")
    add_options(listing, repo=True)


def add_bundle(commands: Any) -> None:
    """Add ``bundle init|build|publish|verify|list`` to fleetctl's sub-parsers."""
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
    _add_repo_actions(actions)
