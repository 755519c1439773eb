#!/usr/bin/env python3
"""Renders the Palisade chart with the real Helm library and prints what
Helm would send to a cluster.

helm-sdkpy exposes install and lint, not `helm template`, so this installs
the chart into a minimal stand-in for the Kubernetes API served on
loopback, which answers discovery and accepts every create, and records
the objects Helm posts. That is exactly the chart as Helm renders, orders
and validates it (values.schema.json included) for a real install.

    render.py CHART [--values FILE] [--namespace NS]   -> JSON lines on stdout
    render.py CHART --lint                             -> lint messages

Exit status 1 with Helm's own message on stderr when Helm refuses.
"""
import argparse
import asyncio
import json
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import yaml
import helm_sdkpy

# What the stand-in serves discovery for: every kind the chart may create.
GROUPS = {
    "v1": {"configmaps": ("ConfigMap", True), "secrets": ("Secret", True),
           "services": ("Service", True), "serviceaccounts": ("ServiceAccount", True),
           "namespaces": ("Namespace", False), "pods": ("Pod", True)},
    "apps/v1": {"deployments": ("Deployment", True), "daemonsets": ("DaemonSet", True)},
    "rbac.authorization.k8s.io/v1": {
        "clusterroles": ("ClusterRole", False), "clusterrolebindings": ("ClusterRoleBinding", False),
        "roles": ("Role", True), "rolebindings": ("RoleBinding", True)},
    "policy/v1": {"poddisruptionbudgets": ("PodDisruptionBudget", True)},
    "coordination.k8s.io/v1": {"leases": ("Lease", True)},
}


def resource_list(gv):
    return {"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": [
        {"name": name, "singularName": kind.lower(), "namespaced": namespaced, "kind": kind,
         "verbs": ["create", "delete", "get", "list", "patch", "update", "watch"]}
        for name, (kind, namespaced) in GROUPS[gv].items()]}


def serve(objects):
    class Api(BaseHTTPRequestHandler):
        def reply(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            path = self.path.split("?")[0]
            if path == "/version":
                return self.reply(200, {"major": "1", "minor": "33", "gitVersion": "v1.33.0"})
            if path == "/api":
                return self.reply(200, {"kind": "APIVersions", "versions": ["v1"]})
            if path == "/apis":
                groups = [{"name": gv.split("/")[0],
                           "versions": [{"groupVersion": gv, "version": gv.split("/")[1]}],
                           "preferredVersion": {"groupVersion": gv, "version": gv.split("/")[1]}}
                          for gv in GROUPS if "/" in gv]
                return self.reply(200, {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
            if path == "/api/v1":
                return self.reply(200, resource_list("v1"))
            if path.startswith("/apis/") and path.count("/") == 3 and path[6:] in GROUPS:
                return self.reply(200, resource_list(path[6:]))
            if path.endswith("/secrets"):  # Helm's release history: none yet
                return self.reply(200, {"kind": "SecretList", "apiVersion": "v1", "metadata": {}, "items": []})
            self.reply(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                             "reason": "NotFound", "code": 404})

        def do_POST(self):
            data = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(data or b"{}")
            except ValueError:
                # Helm's release record (a Secret in protobuf): not the chart's.
                return self.reply(201, {"kind": "Secret", "apiVersion": "v1", "metadata": {"name": "release"}})
            if body.get("metadata", {}).get("labels", {}).get("owner") != "helm":
                objects.append(body)
            self.reply(201, body)

        do_PUT = do_POST

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def install(chart, values, namespace):
    objects = []
    server = serve(objects)
    with tempfile.NamedTemporaryFile("w", suffix=".kubeconfig") as kubeconfig:
        yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config",
            "clusters": [{"name": "stand-in", "cluster": {"server": f"http://127.0.0.1:{server.server_port}"}}],
            "users": [{"name": "u", "user": {}}],
            "contexts": [{"name": "c", "context": {"cluster": "stand-in", "user": "u", "namespace": namespace}}],
            "current-context": "c",
        }, kubeconfig)
        kubeconfig.flush()
        config = helm_sdkpy.Configuration(namespace=namespace, kubeconfig=kubeconfig.name)
        asyncio.run(helm_sdkpy.Install(config).run(
            "palisade", chart, values=values, wait=False, timeout=60))
    server.shutdown()
    return objects


def main():
    p = argparse.ArgumentParser()
    p.add_argument("chart")
    p.add_argument("--values")
    p.add_argument("--namespace", default="palisade-system")
    p.add_argument("--lint", action="store_true")
    args = p.parse_args()
    try:
        if args.lint:
            result = asyncio.run(helm_sdkpy.Lint(helm_sdkpy.Configuration()).run(args.chart))
            print(json.dumps(result))
            return 1 if result.get("Errors") else 0
        values = {}
        if args.values:
            with open(args.values) as f:
                values = yaml.safe_load(f) or {}
        for obj in install(args.chart, values, args.namespace):
            print(json.dumps(obj, sort_keys=True))
        return 0
    except helm_sdkpy.HelmError as e:
        print(f"helm refused: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
