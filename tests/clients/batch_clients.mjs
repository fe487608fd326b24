// Real clients' batches through a proxy: ethers v6 (its default batching: calls made within 10 ms
// go as one batch) and viem (an http transport with `batch: true`). Each makes the same calls at
// once and prints, as one JSON line per client, the results as the client decoded them.
// Usage: node batch_clients.mjs URL BLOCK_NUMBER TX_HASH ADDRESS TOPIC
import { JsonRpcProvider } from "ethers";
import { createPublicClient, http } from "viem";

const [url, blockNumber, txHash, address, topic] = process.argv.slice(2);
const number = BigInt(blockNumber);

// ethers: each call its own request; the provider batches what comes within batchStallTime
const provider = new JsonRpcProvider(url, undefined, { staticNetwork: true });
const [eBlock, eReceipt, eLogs, eBalance] = await Promise.all([
  provider.send("eth_getBlockByNumber", ["0x" + number.toString(16), true]),
  provider.send("eth_getTransactionReceipt", [txHash]),
  provider.send("eth_getLogs", [{ fromBlock: "0x1", toBlock: "0x" + number.toString(16), topics: [topic] }]),
  provider.send("eth_getBalance", [address, "0x" + number.toString(16)]),
]);
console.log(JSON.stringify({ client: "ethers", block: eBlock, receipt: eReceipt, logs: eLogs, balance: eBalance }));
provider.destroy();

// viem: its typed actions, batched by the transport; the raw results through `request`
const client = createPublicClient({ transport: http(url, { batch: true }) });
const [vBlock, vReceipt, vLogs, vBalance] = await Promise.all([
  client.request({ method: "eth_getBlockByNumber", params: ["0x" + number.toString(16), true] }),
  client.request({ method: "eth_getTransactionReceipt", params: [txHash] }),
  client.request({ method: "eth_getLogs", params: [{ fromBlock: "0x1", toBlock: "0x" + number.toString(16), topics: [topic] }] }),
  client.request({ method: "eth_getBalance", params: [address, "0x" + number.toString(16)] }),
]);
console.log(JSON.stringify({ client: "viem", block: vBlock, receipt: vReceipt, logs: vLogs, balance: vBalance }));
