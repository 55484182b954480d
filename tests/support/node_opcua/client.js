#!/usr/bin/env node
// node-opcua as the independent OPC UA client of the agent's OPC UA server's tests
// (tests/agent/line/test_opcua_server.py): one session, a list of steps, one JSON line
// per step on stdout.
//
//   node client.js '<json plan>'
//
// The plan: {endpoint, security: "None" | "Sign" | "SignAndEncrypt", user, password,
// cert, key, pki, timeout_s, steps: [...]}. A path is a list of "<ns>:<name>" where <ns>
// is "own" (the server's namespace, plan.own), "mv" (OPC 40100's) or "ua" (0). Steps:
//   {op: "read", path}                       -> {value, status}
//   {op: "browse", path}                     -> {names: [...]}
//   {op: "write", path, value}               -> {status} (a String value)
//   {op: "call", object, method, args}       -> {status, outputs}
//       args: [{type: "Int32" | "UInt32" | "String" | "Boolean", value}
//              | {type: "ext", dataType: "mv:i=3015", value: {...}} | {type: "null"}]
//   {op: "events", path, count, seconds}     -> {events: [...]}: prints {"ready": true}
//       once subscribed, then waits for `count` ResultReady events (or `seconds`).
//   {op: "sync"}                             -> prints {"ready": true, "sync": true} and
//       waits for a line on stdin (the test acts on the server meanwhile).
// The first line is {"connected": true} or {"error": "..."} (exit 2). Exit 0 otherwise.

"use strict";

const fs = require("fs");
const path = require("path");
const {
    OPCUAClient,
    MessageSecurityMode,
    SecurityPolicy,
    UserTokenType,
    AttributeIds,
    DataType,
    Variant,
    VariantArrayType,
    makeBrowsePath,
    resolveNodeId,
    TimestampsToReturn,
    constructEventFilter,
    ClientMonitoredItem,
    coerceNodeId,
} = require("node-opcua-client");
const { OPCUACertificateManager } = require("node-opcua-certificate-manager");

const MV_URI = "http://opcfoundation.org/UA/MachineVision";

const stdinLines = [];
let stdinWaiter = null;
process.stdin.setEncoding("utf8");
process.stdin.on("data", (chunk) => {
    for (const ch of chunk) {
        if (ch !== "\n") continue;
        if (stdinWaiter) {
            const wake = stdinWaiter;
            stdinWaiter = null;
            wake();
        } else {
            stdinLines.push(ch);
        }
    }
});

function nextLine() {
    if (stdinLines.length > 0) {
        stdinLines.shift();
        return Promise.resolve();
    }
    return new Promise((resolve) => (stdinWaiter = resolve));
}

function emit(obj) {
    process.stdout.write(JSON.stringify(obj, jsonSafe) + "\n");
}

function jsonSafe(key, value) {
    if (typeof value === "bigint") return value.toString();
    if (value && value.type === "Buffer" && Array.isArray(value.data)) {
        return Buffer.from(value.data).toString("hex");
    }
    return value;
}

function plain(value) {
    // a node-opcua value (Variant content, ExtensionObject, LocalizedText, ...) as JSON
    if (value === null || value === undefined) return null;
    if (Array.isArray(value) || ArrayBuffer.isView(value)) return Array.from(value, plain);
    if (value instanceof Date) return value.toISOString();
    if (Buffer.isBuffer(value)) return value.toString("hex");
    if (value instanceof Variant) return plain(value.value);
    if (typeof value === "object") {
        if (typeof value.toJSON === "function") {
            const json = value.toJSON();
            if (json !== value) return plain(json);
        }
        const out = {};
        for (const key of Object.keys(value)) {
            if (key.startsWith("_") || key === "schema") continue;
            out[key] = plain(value[key]);
        }
        return out;
    }
    return value;
}

async function main() {
    const plan = JSON.parse(process.argv[2]);
    const timeoutS = plan.timeout_s || 30;
    setTimeout(() => {
        emit({ error: `client.js: no end within ${timeoutS} s` });
        process.exit(3);
    }, timeoutS * 1000).unref();

    const modes = {
        None: MessageSecurityMode.None,
        Sign: MessageSecurityMode.Sign,
        SignAndEncrypt: MessageSecurityMode.SignAndEncrypt,
    };
    const security = plan.security || "None";
    const manager = new OPCUACertificateManager({
        rootFolder: plan.pki,
        automaticallyAcceptUnknownCertificate: true,
    });
    await manager.initialize();
    const options = {
        applicationName: "edgefleet-test-node-opcua",
        applicationUri: plan.application_uri || "urn:edgefleet:test:node-opcua",
        securityMode: modes[security],
        securityPolicy: security === "None" ? SecurityPolicy.None : SecurityPolicy.Basic256Sha256,
        endpointMustExist: false,
        clientCertificateManager: manager,
        connectionStrategy: { maxRetry: 0, initialDelay: 100, maxDelay: 200 },
        requestedSessionTimeout: 60000,
        defaultTransactionTimeout: 10000,
    };
    if (plan.cert) {
        options.certificateFile = plan.cert;
        options.privateKeyFile = plan.key;
    }
    const client = OPCUAClient.create(options);
    let session;
    try {
        await client.connect(plan.endpoint);
        const identity = plan.user
            ? { type: UserTokenType.UserName, userName: plan.user, password: plan.password }
            : { type: UserTokenType.Anonymous };
        session = await client.createSession(identity);
    } catch (err) {
        emit({ error: String(err && err.message ? err.message : err) });
        try {
            await client.disconnect();
        } catch (_) {
            /* already down */
        }
        process.exit(2);
    }
    emit({ connected: true });

    const nsArray = (await session.read({ nodeId: "i=2255", attributeId: AttributeIds.Value })).value
        .value;
    const nsIndex = { ua: 0, mv: nsArray.indexOf(MV_URI), own: nsArray.indexOf(plan.own) };

    function qualified(element) {
        const [ns, ...rest] = element.split(":");
        return `${nsIndex[ns]}:${rest.join(":")}`;
    }

    async function resolve(elements) {
        const browsePath = makeBrowsePath("i=85", "/" + elements.map(qualified).join("/"));
        const result = await session.translateBrowsePath(browsePath);
        if (!result.targets || result.targets.length === 0) {
            throw new Error(`no node at ${elements.join("/")}: ${result.statusCode.name}`);
        }
        return result.targets[0].targetId;
    }

    function dataTypeId(spec) {
        const [ns, id] = spec.split(":");
        return coerceNodeId(`ns=${nsIndex[ns]};${id}`);
    }

    async function argument(arg) {
        switch (arg.type) {
            case "ext":
                return new Variant({
                    dataType: DataType.ExtensionObject,
                    value: await session.constructExtensionObject(dataTypeId(arg.dataType), arg.value),
                });
            case "null":
                return new Variant({ dataType: DataType.ExtensionObject, value: null });
            case "ext-array":
                return new Variant({
                    dataType: DataType.ExtensionObject,
                    arrayType: VariantArrayType.Array,
                    value: [],
                });
            default:
                return new Variant({ dataType: DataType[arg.type], value: arg.value });
        }
    }

    for (const step of plan.steps) {
        try {
            if (step.op === "read") {
                const dv = await session.read({
                    nodeId: await resolve(step.path),
                    attributeId: AttributeIds.Value,
                });
                emit({ op: "read", status: dv.statusCode.name, value: plain(dv.value.value) });
            } else if (step.op === "browse") {
                const result = await session.browse(await resolve(step.path));
                emit({
                    op: "browse",
                    status: result.statusCode.name,
                    names: result.references.map((r) => r.browseName.toString()),
                });
            } else if (step.op === "write") {
                const status = await session.write({
                    nodeId: await resolve(step.path),
                    attributeId: AttributeIds.Value,
                    value: { value: { dataType: DataType.String, value: step.value } },
                });
                emit({ op: "write", status: status.name });
            } else if (step.op === "call") {
                const objectId = await resolve(step.object);
                const methodId = await resolve(step.object.concat(step.method));
                const inputArguments = [];
                for (const arg of step.args || []) inputArguments.push(await argument(arg));
                const result = await session.call({ objectId, methodId, inputArguments });
                emit({
                    op: "call",
                    status: result.statusCode.name,
                    outputs: (result.outputArguments || []).map((v) => plain(v.value)),
                });
            } else if (step.op === "sync") {
                emit({ ready: true, sync: true });
                await nextLine();
            } else if (step.op === "events") {
                emit({ op: "events", events: await events(session, await resolve(step.path), step) });
            } else {
                emit({ op: step.op, error: "unknown op" });
            }
        } catch (err) {
            emit({ op: step.op, error: String(err && err.message ? err.message : err) });
        }
    }
    await session.close();
    await client.disconnect();
    process.stdin.pause();
    process.exit(0);

    async function events(session, nodeId, step) {
        const fields = [
            "EventType",
            "SourceName",
            "Message",
            `${nsIndex.mv}:ResultId`,
            `${nsIndex.mv}:IsPartial`,
            `${nsIndex.mv}:ResultState`,
            `${nsIndex.mv}:JobId`,
            `${nsIndex.mv}:PartId`,
            `${nsIndex.mv}:InternalRecipeId`,
            `${nsIndex.mv}:CreationTime`,
            `${nsIndex.mv}:ResultContent`,
        ];
        const subscription = await session.createSubscription2({
            requestedPublishingInterval: 50,
            requestedLifetimeCount: 600,
            requestedMaxKeepAliveCount: 20,
            publishingEnabled: true,
        });
        const got = [];
        let done;
        const finished = new Promise((resolve) => (done = resolve));
        const item = ClientMonitoredItem.create(
            subscription,
            { nodeId, attributeId: AttributeIds.EventNotifier },
            { queueSize: 1000, filter: constructEventFilter(fields), discardOldest: false },
            TimestampsToReturn.Neither,
        );
        item.on("changed", (values) => {
            const event = {};
            fields.forEach((name, i) => {
                event[name.replace(/^\d+:/, "")] = plain(values[i].value);
            });
            got.push(event);
            if (got.length >= (step.count || 1)) done();
        });
        await new Promise((resolve, reject) => {
            item.once("initialized", resolve);
            item.once("err", reject);
        });
        emit({ ready: true });
        await Promise.race([finished, new Promise((r) => setTimeout(r, (step.seconds || 10) * 1000))]);
        await subscription.terminate();
        return got;
    }
}

main().catch((err) => {
    emit({ error: String(err && err.stack ? err.stack : err) });
    process.exit(1);
});
