//! L3: the incremental assembler of a streamed model turn, for both providers' event
//! streams. It is fed the body as it grows (the vault's `complete_when`), answers true
//! once the terminal event arrived (`[DONE]`, `message_stop`) so the vault stops reading,
//! and yields the same [`ModelTurn`] a non-streamed answer gives.

use serde_json::Value;

use crate::error::ModelError;
use crate::parse;
use crate::provider::{FinishReason, ModelTurn, Progress, ToolCallRequest, Usage};
use crate::sse::{Event, Framer};

/// Which API's event stream is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamApi {
    /// Chat completions chunks (`choices[0].delta`), ended by `data: [DONE]`.
    OpenAi,
    /// Messages events (`message_start` ... `message_stop`).
    Anthropic,
}

/// A tool call being assembled: its id and name from the first fragment that carries
/// them, its arguments text concatenated from every fragment.
#[derive(Debug, Default)]
struct PartialCall {
    /// OpenAI's `index`, Anthropic's content block index.
    index: u64,
    id: String,
    name: String,
    arguments: String,
    /// Anthropic: the input the block's start carried, read only when no delta follows.
    start_input: String,
}

/// An Anthropic content block being assembled.
#[derive(Debug)]
enum Block {
    Text { index: u64, text: String },
    Tool(PartialCall),
}

/// Assembles one streamed turn from the body as it arrives (L3).
///
/// Feed it the whole body read so far each time (it remembers where it stopped); it
/// answers true once the stream's terminal event or an error event has arrived. Then
/// [`StreamAssembler::finish`] gives the turn, or the error: a stream that ended before its
/// terminal event is [`ModelError::Incomplete`] (`maybe_delivered`), never a partial answer.
pub struct StreamAssembler {
    api: StreamApi,
    framer: Framer,
    text: String,
    calls: Vec<PartialCall>,
    blocks: Vec<Block>,
    finish: Option<FinishReason>,
    input_tokens: Option<u64>,
    output_tokens: Option<u64>,
    /// Output deltas seen (text, thinking and tool-argument fragments).
    deltas: u64,
    done: bool,
    failure: Option<ModelError>,
    progress: Option<Progress>,
    /// How much of the body has been fed.
    seen: usize,
    /// Reading what the body's end left unterminated: a line that does not parse there
    /// was cut, not malformed.
    at_end: bool,
}

impl std::fmt::Debug for StreamAssembler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The text is the model's output: not for logs.
        f.debug_struct("StreamAssembler")
            .field("api", &self.api)
            .field("deltas", &self.deltas)
            .field("done", &self.done)
            .finish_non_exhaustive()
    }
}

impl StreamAssembler {
    /// An assembler for `api`'s stream; `progress` is told the output deltas so far.
    pub fn new(api: StreamApi, progress: Option<Progress>) -> Self {
        Self {
            api,
            framer: Framer::default(),
            text: String::new(),
            calls: Vec::new(),
            blocks: Vec::new(),
            finish: None,
            input_tokens: None,
            output_tokens: None,
            deltas: 0,
            done: false,
            failure: None,
            progress,
            seen: 0,
            at_end: false,
        }
    }

    /// Reads what `body` has beyond what was fed before; true once the terminal event or
    /// an error event has arrived (stop reading).
    pub fn feed(&mut self, body: &[u8]) -> bool {
        if self.done || self.failure.is_some() {
            return true;
        }
        self.seen = body.len();
        let mut framer = std::mem::take(&mut self.framer);
        let stop = framer.feed(body, |event| self.event(event));
        self.framer = framer;
        stop
    }

    /// How many bytes of body have been fed.
    pub fn fed(&self) -> usize {
        self.seen
    }

    /// The output deltas seen so far (about one per token).
    pub fn deltas(&self) -> u64 {
        self.deltas
    }

    /// The turn, once the whole body (`body`, the same bytes fed before) has been read.
    pub fn finish(mut self, body: &[u8]) -> Result<ModelTurn, ModelError> {
        if !self.done && self.failure.is_none() {
            self.at_end = true;
            let mut framer = std::mem::take(&mut self.framer);
            framer.finish(body, |event| self.event(event));
        }
        if let Some(failure) = self.failure {
            return Err(failure);
        }
        if !self.done {
            // L3, V8: the model may have generated and acted on more than arrived; a
            // partial answer is never passed off as complete.
            let terminal = match self.api {
                StreamApi::OpenAi => "data: [DONE]",
                StreamApi::Anthropic => "message_stop",
            };
            return Err(ModelError::Incomplete {
                detail: format!(
                    "the stream ended after {} bytes and {} output deltas without {terminal}",
                    body.len(),
                    self.deltas
                ),
            });
        }
        let usage = match (self.input_tokens, self.output_tokens) {
            (None, None) => None,
            (input, output) => Some(Usage {
                input_tokens: input.unwrap_or(0),
                output_tokens: output.unwrap_or(0),
            }),
        };
        let (text, calls) = match self.api {
            StreamApi::OpenAi => (self.text, self.calls),
            StreamApi::Anthropic => {
                let mut texts = Vec::new();
                let mut calls = Vec::new();
                for block in self.blocks {
                    match block {
                        Block::Text { text, .. } => texts.push(text),
                        Block::Tool(call) => calls.push(call),
                    }
                }
                // The same join as a non-streamed answer's text blocks.
                (texts.join("\n"), calls)
            }
        };
        let tool_calls = calls
            .into_iter()
            .enumerate()
            .map(|(n, call)| {
                if call.name.is_empty() {
                    return Err(ModelError::Malformed(format!(
                        "streamed tool call {} has no function name",
                        n + 1
                    )));
                }
                let id = if call.id.is_empty() {
                    format!("call-{}", n + 1)
                } else {
                    call.id
                };
                let text = if call.arguments.is_empty() {
                    &call.start_input
                } else {
                    &call.arguments
                };
                let (arguments, invalid_arguments) = parse::arguments_from_text(text);
                Ok(ToolCallRequest {
                    id,
                    name: call.name,
                    arguments,
                    invalid_arguments,
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(ModelTurn {
            text: (!text.is_empty()).then_some(text),
            tool_calls,
            finish: self.finish,
            usage,
        })
    }

    /// One event; true when the stream is over for us.
    fn event(&mut self, event: Event) -> bool {
        match self.api {
            StreamApi::OpenAi => self.openai(event),
            StreamApi::Anthropic => self.anthropic(event),
        }
        self.done || self.failure.is_some()
    }

    /// An event whose data is not JSON: malformed, unless it is what a cut left.
    fn not_json(&mut self) {
        if !self.at_end {
            self.failure = Some(ModelError::Malformed(
                "a streamed event's data is not JSON".into(),
            ));
        }
    }

    fn delta(&mut self) {
        self.deltas += 1;
        if let Some(progress) = &self.progress {
            progress.report(self.deltas);
        }
    }

    fn openai(&mut self, event: Event) {
        if event.data == "[DONE]" {
            self.done = true;
            return;
        }
        let Ok(chunk) = serde_json::from_str::<Value>(&event.data) else {
            self.not_json();
            return;
        };
        if let Some(error) = chunk.get("error") {
            self.failure = Some(provider_error(error));
            return;
        }
        // L5: the usage chunk (`stream_options.include_usage`); a server that sends usage
        // on every chunk is read by its last.
        if let Some(usage) = chunk.get("usage").filter(|u| !u.is_null()) {
            self.input_tokens = usage
                .get("prompt_tokens")
                .and_then(Value::as_u64)
                .or(self.input_tokens);
            self.output_tokens = usage
                .get("completion_tokens")
                .and_then(Value::as_u64)
                .or(self.output_tokens);
        }
        let Some(choice) = chunk.pointer("/choices/0") else {
            return;
        };
        if let Some(reason) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(FinishReason::from(reason.to_string()));
        }
        let Some(delta) = choice.get("delta") else {
            return;
        };
        let mut produced = false;
        if let Some(text) = delta.get("content").and_then(Value::as_str)
            && !text.is_empty()
        {
            self.text.push_str(text);
            produced = true;
        }
        // Reasoning is output the model is charged for, though not part of the answer.
        if delta
            .get("reasoning_content")
            .and_then(Value::as_str)
            .is_some_and(|t| !t.is_empty())
        {
            produced = true;
        }
        if let Some(fragments) = delta.get("tool_calls").and_then(Value::as_array) {
            for fragment in fragments {
                produced |= self.openai_fragment(fragment);
            }
        }
        if produced {
            self.delta();
        }
    }

    /// One `delta.tool_calls[]` fragment, placed by its `index`; true when it carried
    /// argument text.
    fn openai_fragment(&mut self, fragment: &Value) -> bool {
        let id = fragment.get("id").and_then(Value::as_str).unwrap_or("");
        let slot = match fragment.get("index").and_then(Value::as_u64) {
            Some(index) => self
                .calls
                .iter()
                .position(|c| c.index == index)
                .unwrap_or_else(|| {
                    self.calls.push(PartialCall {
                        index,
                        ..PartialCall::default()
                    });
                    self.calls.len() - 1
                }),
            // No index (a few local servers): a new id starts a new call, else the last.
            None => match self.calls.last() {
                Some(last) if id.is_empty() || last.id == id => self.calls.len() - 1,
                _ => {
                    self.calls.push(PartialCall {
                        index: self.calls.len() as u64,
                        ..PartialCall::default()
                    });
                    self.calls.len() - 1
                }
            },
        };
        let call = &mut self.calls[slot];
        if call.id.is_empty() && !id.is_empty() {
            call.id = id.to_string();
        }
        if let Some(name) = fragment.pointer("/function/name").and_then(Value::as_str)
            && call.name.is_empty()
        {
            call.name = name.to_string();
        }
        match fragment.pointer("/function/arguments") {
            Some(Value::String(text)) if !text.is_empty() => {
                call.arguments.push_str(text);
                true
            }
            // Tolerated: a server that sends the object itself.
            Some(object @ Value::Object(_)) => {
                call.arguments = object.to_string();
                true
            }
            _ => false,
        }
    }

    fn anthropic(&mut self, event: Event) {
        let Ok(message) = serde_json::from_str::<Value>(&event.data) else {
            self.not_json();
            return;
        };
        let kind = message
            .get("type")
            .and_then(Value::as_str)
            .or(event.name.as_deref())
            .unwrap_or("");
        let index = message.get("index").and_then(Value::as_u64).unwrap_or(0);
        match kind {
            "message_start" => {
                if let Some(usage) = message.pointer("/message/usage") {
                    self.anthropic_usage(usage);
                }
            }
            "content_block_start" => {
                let block = message.get("content_block").unwrap_or(&Value::Null);
                match block.get("type").and_then(Value::as_str) {
                    Some("text") => {
                        let text = block.get("text").and_then(Value::as_str).unwrap_or("");
                        self.blocks.push(Block::Text {
                            index,
                            text: text.to_string(),
                        });
                    }
                    Some("tool_use") => {
                        // The start carries `input: {}`; the input arrives as deltas. A
                        // non-empty start input stands unless deltas follow.
                        let input = block
                            .get("input")
                            .filter(|i| i.as_object().is_some_and(|o| !o.is_empty()))
                            .map(Value::to_string)
                            .unwrap_or_default();
                        self.blocks.push(Block::Tool(PartialCall {
                            index,
                            id: block.get("id").and_then(Value::as_str).unwrap_or("").into(),
                            name: block
                                .get("name")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .into(),
                            arguments: String::new(),
                            start_input: input,
                        }));
                    }
                    // Thinking and other blocks are not for the executor.
                    _ => {}
                }
            }
            "content_block_delta" => {
                let delta = message.get("delta").unwrap_or(&Value::Null);
                let produced = match delta.get("type").and_then(Value::as_str) {
                    Some("text_delta") => {
                        let text = delta.get("text").and_then(Value::as_str).unwrap_or("");
                        if let Some(Block::Text { text: into, .. }) = self.block(index) {
                            into.push_str(text);
                        }
                        !text.is_empty()
                    }
                    Some("input_json_delta") => {
                        let json = delta
                            .get("partial_json")
                            .and_then(Value::as_str)
                            .unwrap_or("");
                        if let Some(Block::Tool(call)) = self.block(index) {
                            call.arguments.push_str(json);
                        }
                        !json.is_empty()
                    }
                    Some("thinking_delta") => true,
                    _ => false,
                };
                if produced {
                    self.delta();
                }
            }
            "message_delta" => {
                if let Some(reason) = message
                    .pointer("/delta/stop_reason")
                    .and_then(Value::as_str)
                {
                    self.finish = Some(FinishReason::from(reason.to_string()));
                }
                if let Some(usage) = message.get("usage") {
                    self.anthropic_usage(usage);
                }
            }
            "message_stop" => self.done = true,
            "error" => {
                self.failure = Some(provider_error(message.get("error").unwrap_or(&Value::Null)));
            }
            // `ping`, `content_block_stop` and events added later carry nothing we need.
            _ => {}
        }
    }

    fn anthropic_usage(&mut self, usage: &Value) {
        if let Some(input) = usage.get("input_tokens").and_then(Value::as_u64) {
            self.input_tokens = Some(input);
        }
        // `message_delta` carries the cumulative output count.
        if let Some(output) = usage.get("output_tokens").and_then(Value::as_u64) {
            self.output_tokens = Some(output);
        }
    }

    fn block(&mut self, index: u64) -> Option<&mut Block> {
        self.blocks.iter_mut().rev().find(|b| match b {
            Block::Text { index: i, .. } => *i == index,
            Block::Tool(call) => call.index == index,
        })
    }
}

/// An error the provider reported inside the stream: `{"type": ..., "message": ...}`.
fn provider_error(error: &Value) -> ModelError {
    let kind = error
        .get("type")
        .or_else(|| error.get("code"))
        .map(|k| match k {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        })
        .unwrap_or_else(|| "error".into());
    let message = error
        .get("message")
        .and_then(Value::as_str)
        .or_else(|| error.as_str())
        .unwrap_or("no message");
    ModelError::Provider {
        kind: parse::one_line(&kind),
        message: parse::one_line(message),
    }
}
