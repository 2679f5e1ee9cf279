// Drives `blend serve` with the official OpenAI Node client: models (list and retrieve), chat,
// completions, streaming (with usage), a 404 for an unknown model, and a Batch API round trip
// with files.list, batches.list and files.del.
// Usage: node openai_client.cjs BASE_URL API_KEY   (prints "openai client: ok" on success)
'use strict';
const assert = require('node:assert/strict');
const { OpenAI, toFile } = require('openai');

async function main() {
  const [baseURL, apiKey] = process.argv.slice(2);
  const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 120000 });

  const models = await client.models.list();
  const model = models.data[0].id;
  assert.equal(model, 'tiny');
  const retrieved = await client.models.retrieve(model);
  assert.equal(retrieved.id, model);
  await assert.rejects(client.models.retrieve('nope'), (e) => e.status === 404);

  const messages = [{ role: 'user', content: 'Say something' }];
  const args = { model, max_tokens: 8, temperature: 0, ignore_eos: true };
  const chat = await client.chat.completions.create({ ...args, messages });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].message.role, 'assistant');
  assert.equal(chat.usage.completion_tokens, 8);

  const completion = await client.completions.create({ ...args, prompt: 'Hello' });
  assert.equal(completion.object, 'text_completion');
  assert.equal(completion.usage.completion_tokens, 8);

  // Streams: the deltas add up to the non-streamed text; usage comes in the last chunk.
  let text = '';
  let usage = null;
  const chatStream = await client.chat.completions.create({
    ...args, messages, stream: true, stream_options: { include_usage: true },
  });
  for await (const chunk of chatStream) {
    if (chunk.choices.length) text += chunk.choices[0].delta.content ?? '';
    if (chunk.usage) usage = chunk.usage;
  }
  assert.equal(text, chat.choices[0].message.content);
  assert.equal(usage.completion_tokens, 8);

  text = '';
  const completionStream = await client.completions.create({ ...args, prompt: 'Hello', stream: true });
  for await (const chunk of completionStream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, completion.choices[0].text);

  await assert.rejects(client.completions.create({ model: 'nope', prompt: 'x' }),
                       (e) => e.status === 404);

  // Batch API: upload, create, poll, download.
  const lines = ['a', 'b'].map((id) => JSON.stringify({
    custom_id: id, method: 'POST', url: '/v1/chat/completions',
    body: { ...args, messages },
  })).join('\n') + '\n';
  const file = await client.files.create({
    file: await toFile(Buffer.from(lines), 'input.jsonl'), purpose: 'batch',
  });
  assert.equal(file.purpose, 'batch');
  let batch = await client.batches.create({
    input_file_id: file.id, endpoint: '/v1/chat/completions', completion_window: '24h',
  });
  for (let i = 0; i < 1200 && batch.status !== 'completed'; ++i) {
    await new Promise((resolve) => setTimeout(resolve, 50));
    batch = await client.batches.retrieve(batch.id);
  }
  assert.equal(batch.status, 'completed');
  assert.equal(batch.request_counts.completed, 2);
  const content = await (await client.files.content(batch.output_file_id)).text();
  const results = content.trim().split('\n').map((l) => JSON.parse(l));
  assert.deepEqual(results.map((r) => r.custom_id).sort(), ['a', 'b']);
  for (const r of results) {
    assert.equal(r.response.status_code, 200);
    assert.equal(r.response.body.choices[0].message.content, chat.choices[0].message.content);
  }

  // Listing: the upload and the batch's output file; the batch itself.
  const files = [];
  for await (const f of client.files.list()) files.push(f.id);
  assert.ok(files.includes(file.id), `files.list lacks ${file.id}: ${files}`);
  assert.ok(files.includes(batch.output_file_id));
  const batches = [];
  for await (const b of client.batches.list({ limit: 1 })) batches.push(b.id);
  assert.deepEqual(batches, [batch.id]);
  const deleted = await client.files.del(file.id);
  assert.equal(deleted.deleted, true);
  await assert.rejects(client.files.retrieve(file.id), (e) => e.status === 404);
  console.log('openai client: ok');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
