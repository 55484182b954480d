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
import sys
from pathlib import Path
from typing import Any

from agent.kernel.bundle import Bundle, init_bundle
from agent.kernel.errors import EdgefleetError
from agent.wire.manifest import MANIFEST_NAME, ClassificationPost, ScorePost
from agent.wire.postprocess import POSTPROCESS_KINDS
from fleet_server.cli_fleet import add_fleet_commands
from fleet_server.cli_repo import (
    add_bundle_repo_actions,
    add_directive,
    add_keys,
    add_repo,
)
from fleet_server.cli_users import add_users_commands
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
    add_bundle_repo_actions(actions)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fleetctl",
        description="Operate an edgefleet fleet: signing keys, the bundle repository, "
        "model bundles, directives, devices, rollouts and users.",
        epilog="example:\n  fleetctl bundle init model.onnx --out bundles/my-model\n"
        "  fleetctl bundle publish bundles/my-model --repo repo --keystore keys",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_keys(commands)
    add_repo(commands)
    _add_bundle(commands)
    add_directive(commands)
    add_fleet_commands(commands)
    add_users_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    try:
        code: int = args.func(args)
    except EdgefleetError as exc:
        message = " ".join(str(exc).split())
        print(f"fleetctl: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":
    sys.exit(main())
