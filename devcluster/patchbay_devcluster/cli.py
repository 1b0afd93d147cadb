"""``patchbay-devcluster``: start, inspect and stop the local cluster from a shell or Makefile."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

from patchbay_devcluster import imagebuild
from patchbay_devcluster.cluster import BIN_ENV, STATE_ENV, ClusterError, DevCluster, default_state_dir
from patchbay_devcluster.node import NODE_IP

EPILOG = f"""\
examples:
  patchbay-devcluster up --nodes 50       # control plane + kwok + 50 fake nodes
  export KUBECONFIG=$(patchbay-devcluster kubeconfig)
  kubectl get nodes
  patchbay-devcluster down                # stops every process by PID, removes the state

environment:
  {BIN_ENV}   directory with etcd, kube-apiserver, ... (`make setup` builds them)
  {STATE_ENV}   state directory (default $XDG_STATE_HOME/patchbay/devcluster,
                            or ~/.local/state/patchbay/devcluster)
"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="patchbay-devcluster",
        description="A real local Kubernetes control plane (etcd, kube-apiserver, "
        "kube-controller-manager, kube-scheduler) plus kwok fake nodes, on 127.0.0.1 only. With "
        "--real-node, its pods reach the API server through a relay on the pod network's bridge "
        f"address {NODE_IP}, the only address besides loopback that the tool's processes listen on.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--state-dir", type=Path, default=None, help="where everything lives (see below)")
    p.add_argument("--bin-dir", type=Path, default=None, help=f"Kubernetes binaries (default ${BIN_ENV})")
    p.add_argument("-q", "--quiet", action="store_true", help="only errors")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    up = sub.add_parser("up", help="start the cluster (idempotent) and ensure --nodes kwok nodes")
    up.add_argument("--nodes", type=int, default=0, help="kwok nodes kwok-node-0..N-1 (default 0)")
    up.add_argument(
        "--real-node",
        action="store_true",
        help="also run a real node 'localhost': the pinned kubelet on containerd + runc, and a relay "
        "that lets its pods reach the API server (`status` prints it as podServer; needs root)",
    )
    up.add_argument("--timeout", type=float, default=120.0, help="seconds per readiness wait")
    nodes = sub.add_parser("add-nodes", help="add kwok nodes to a running cluster")
    nodes.add_argument("--count", type=int, required=True)
    nodes.add_argument("--prefix", default="kwok-node-")
    nodes.add_argument("--start", type=int, default=0, help="first index")
    nodes.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
    down = sub.add_parser("down", help="stop every process the cluster started and remove its state")
    down.add_argument("--keep-state", action="store_true", help="keep certificates, data and logs")
    images = sub.add_parser(
        "images",
        help="build the operator and agent images from this checkout (podman, cached by content)",
        description="Build the project's images with podman from their Dockerfiles on a local "
        "Debian base (mmdebstrap), with wheels built on the host and installed offline; cached by a "
        "hash of their inputs. Prints each image's name and OCI archive.",
    )
    images.add_argument("--repo", type=Path, default=None, help="the checkout (default: found from .)")
    images.add_argument("--force", action="store_true", help="rebuild even when cached")
    images.add_argument(
        "--arch",
        default=imagebuild.NATIVE,
        choices=imagebuild.ARCHITECTURES,
        help="the images' architecture (default: %(default)s; arm64 under qemu-user emulation, "
        "hack/arm64-emulation.sh)",
    )
    images.add_argument("--load", action="store_true", help="import them into the running real node")
    images.add_argument("--json", action="store_true", help="print {program: {ref, archive}} as JSON")
    sub.add_parser("status", help="processes, ports, /readyz, as JSON")
    sub.add_parser("kubeconfig", help="print the admin kubeconfig's path")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.ERROR if args.quiet else logging.INFO,
        format="%(asctime)s %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    cluster = DevCluster(args.state_dir or default_state_dir(), args.bin_dir)
    try:
        if args.command == "up":
            if args.nodes < 0:
                raise ClusterError("--nodes must be >= 0")
            cluster.up(nodes=args.nodes, real_node=args.real_node, timeout=args.timeout)
            print(cluster.kubeconfig)
        elif args.command == "add-nodes":
            labels = {}
            for item in args.label:
                key, sep, value = item.partition("=")
                if not sep or not key:
                    raise ClusterError(f"--label {item!r}: expected KEY=VALUE")
                labels[key] = value
            cluster.add_kwok_nodes(args.count, prefix=args.prefix, labels=labels, start=args.start)
        elif args.command == "down":
            stopped = cluster.down(purge=not args.keep_state)
            print("stopped: " + (", ".join(stopped) if stopped else "nothing was running"))
        elif args.command == "images":
            built = imagebuild.build_all(args.repo, force=args.force, arch=args.arch)
            if args.load and args.arch != imagebuild.NATIVE:
                raise ClusterError(f"--load: the real node runs {imagebuild.NATIVE} images, not {args.arch}")
            if args.load:
                cluster.load_images((b.ref, b.archive) for b in built.values())
            if args.json:
                print(json.dumps({k: {"ref": b.ref, "archive": str(b.archive)} for k, b in built.items()}))
            else:
                for b in built.values():
                    how = "built" if b.built else "cached"
                    print(f"{b.ref}  {b.archive}  {b.size_bytes / 1e6:.0f} MB  ({how}, {b.seconds:.1f}s)")
        elif args.command == "status":
            st = cluster.status()
            print(json.dumps(st, indent=2))
            return 0 if st.get("readyz") else 1
        elif args.command == "kubeconfig":
            if not cluster.kubeconfig.exists():
                raise ClusterError(f"no cluster in {cluster.dir}: run `patchbay-devcluster up`")
            print(cluster.kubeconfig)
    except (ClusterError, imagebuild.ImageBuildError) as e:
        print(f"patchbay-devcluster: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
