//! The session routes: create, list, get, delete, prompt, interrupt, resume, and the
//! transcript.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::ApiError;
use super::{extract, State};
use crate::id::{MessageId, SessionId};
use crate::records::{
    Anchor, Cursor, Delivery, Direction, ListQuery, MessagesQuery, Order, ParentFilter,
};
use crate::service::{CreateSession, Creation, PromptInput};

/// `POST /sessions` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateBody {
    id: Option<SessionId>,
    parent_id: Option<SessionId>,
    title: Option<String>,
    directory: Option<String>,
    agent: Option<String>,
    model: Option<Value>,
}

/// `POST /sessions`: 201 with the new session, 200 with the stored one when `id` exists.
pub(super) async fn create(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let body = extract::body(&req, payload, &state.options).await?;
    let body: CreateBody = extract::json(&body)?;
    let creation = state
        .runtime
        .sessions()
        .create(CreateSession {
            id: body.id,
            parent_id: body.parent_id,
            title: body.title,
            directory: body.directory.unwrap_or_default(),
            agent: body.agent,
            model: body.model,
        })
        .await?;
    Ok(match creation {
        Creation::Created(info) => HttpResponse::Created().json(info),
        Creation::Existing(info) => HttpResponse::Ok().json(info),
    })
}

/// `GET /sessions` query.
#[derive(Debug, Deserialize)]
struct ListParams {
    directory: Option<String>,
    search: Option<String>,
    limit: Option<usize>,
    order: Option<Order>,
    anchor_id: Option<SessionId>,
    anchor_time: Option<i64>,
    direction: Option<Direction>,
    parent_id: Option<SessionId>,
    top_level: Option<bool>,
}

impl ListParams {
    fn into_query(self) -> Result<ListQuery, ApiError> {
        let anchor = match (self.anchor_id, self.anchor_time) {
            (Some(id), Some(time)) => Some(Anchor {
                id,
                time,
                direction: self.direction.unwrap_or_default(),
            }),
            (None, None) if self.direction.is_some() => {
                return Err(ApiError::invalid(
                    "`direction` needs `anchor_id` and `anchor_time`",
                ))
            }
            (None, None) => None,
            _ => {
                return Err(ApiError::invalid(
                    "`anchor_id` and `anchor_time` go together",
                ))
            }
        };
        let parent = match (self.parent_id, self.top_level) {
            (Some(_), Some(true)) => {
                return Err(ApiError::invalid(
                    "`parent_id` and `top_level=true` exclude each other",
                ))
            }
            (Some(parent), _) => ParentFilter::ChildrenOf(parent),
            (None, Some(true)) => ParentFilter::TopLevel,
            (None, _) => ParentFilter::Any,
        };
        Ok(ListQuery {
            directory: self.directory,
            parent,
            search: self.search,
            limit: self.limit,
            order: self.order.unwrap_or_default(),
            anchor,
        })
    }
}

/// `GET /sessions`: a JSON array of sessions.
pub(super) async fn list(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let query = extract::query::<ListParams>(&req)?.into_query()?;
    let sessions = state.runtime.sessions().list(query).await?;
    Ok(HttpResponse::Ok().json(sessions))
}

/// `GET /sessions/{id}`.
pub(super) async fn get(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let id = extract::session_id(&req)?;
    let session = state.runtime.sessions().get(&id).await?;
    Ok(HttpResponse::Ok().json(session))
}

/// `DELETE /sessions/{id}` query.
#[derive(Debug, Deserialize)]
struct DeleteParams {
    force: Option<bool>,
}

/// `DELETE /sessions/{id}?force=`: 200 `{"deleted": [ids]}` (the session first, then the
/// sessions below it), 404, or 409 `session_busy` while a turn is in flight and `force` is not
/// `true`.
pub(super) async fn delete(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let id = extract::session_id(&req)?;
    let params: DeleteParams = extract::query(&req)?;
    let deleted = state
        .runtime
        .sessions()
        .delete(&id, params.force.unwrap_or(false))
        .await?;
    Ok(HttpResponse::Ok().json(json!({ "deleted": deleted })))
}

/// `POST /sessions/{id}/prompt` body: exactly one of `text` and `prompt`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PromptBody {
    id: Option<MessageId>,
    text: Option<String>,
    prompt: Option<Value>,
    delivery: Option<Delivery>,
    resume: Option<bool>,
}

/// `POST /sessions/{id}/prompt`: 202 with the admission.
pub(super) async fn prompt(
    req: HttpRequest,
    payload: web::Payload,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let session_id = extract::session_id(&req)?;
    let body = extract::body(&req, payload, &state.options).await?;
    let body: PromptBody = extract::json(&body)?;
    let prompt = match (body.text, body.prompt) {
        (Some(text), None) => json!({ "text": text }),
        (None, Some(prompt)) => prompt,
        _ => return Err(ApiError::invalid(
            "exactly one of `text` (a string) and `prompt` (a JSON object or string) is required",
        )),
    };
    let input = PromptInput {
        id: body.id,
        session_id,
        prompt,
        delivery: body.delivery.unwrap_or_default(),
        resume: body.resume.unwrap_or(true),
    };
    let admission = state.runtime.sessions().prompt(input).await?;
    Ok(HttpResponse::Accepted().json(admission))
}

/// `POST /sessions/{id}/interrupt`: `{"interrupted": bool}`.
pub(super) async fn interrupt(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let id = extract::session_id(&req)?;
    let sessions = state.runtime.sessions();
    sessions.get(&id).await?;
    let interrupted = sessions.interrupt(&id).await?;
    Ok(HttpResponse::Ok().json(json!({ "interrupted": interrupted })))
}

/// `POST /sessions/{id}/resume`: how the turn ended (the [`crate::Terminal`] JSON).
pub(super) async fn resume(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let id = extract::session_id(&req)?;
    let terminal = state.runtime.sessions().resume(&id).await?;
    Ok(HttpResponse::Ok().json(terminal))
}

/// `POST /sessions/{id}/retry`: how the retried turn ended (the [`crate::Terminal`] JSON); 409
/// `not_retryable` when the last turn did not fail.
pub(super) async fn retry(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let id = extract::session_id(&req)?;
    let terminal = state.runtime.sessions().retry(&id).await?;
    Ok(HttpResponse::Ok().json(terminal))
}

/// `GET /sessions/{id}/steps`: the steps of the session's last turn (a [`crate::TurnSteps`]), or
/// `null` when no turn has run.
pub(super) async fn steps(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let id = extract::session_id(&req)?;
    let steps = state.runtime.sessions().steps(&id).await?;
    Ok(HttpResponse::Ok().json(steps))
}

/// `GET /sessions/{id}/messages` query.
#[derive(Debug, Deserialize)]
struct MessagesParams {
    limit: Option<usize>,
    order: Option<Order>,
    cursor: Option<MessageId>,
    direction: Option<Direction>,
}

/// `GET /sessions/{id}/messages`: a JSON array of transcript messages.
pub(super) async fn messages(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let session_id = extract::session_id(&req)?;
    let params: MessagesParams = extract::query(&req)?;
    let cursor = match (params.cursor, params.direction) {
        (Some(id), direction) => Some(Cursor {
            id,
            direction: direction.unwrap_or_default(),
        }),
        (None, Some(_)) => return Err(ApiError::invalid("`direction` needs `cursor`")),
        (None, None) => None,
    };
    let page = state
        .runtime
        .sessions()
        .messages(MessagesQuery {
            session_id,
            limit: params.limit,
            order: params.order.unwrap_or_default(),
            cursor,
        })
        .await?;
    Ok(HttpResponse::Ok().json(page))
}

/// `GET /sessions/{id}/messages/{message_id}`: one transcript message.
pub(super) async fn message(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let session_id = extract::session_id(&req)?;
    let message_id = extract::message_id(&req)?;
    match state
        .runtime
        .sessions()
        .message(&session_id, &message_id)
        .await?
    {
        Some(message) => Ok(HttpResponse::Ok().json(message)),
        None => Err(ApiError::not_found(format!(
            "message not found: {message_id} in session {session_id}"
        ))),
    }
}

/// `GET /healthz`: `{"status": "ok"}`.
pub(super) async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({ "status": "ok" }))
}

/// `GET /stats`: what the runtime is doing.
pub(super) async fn stats(state: web::Data<State>) -> Result<HttpResponse, ApiError> {
    let stats = state.runtime.stats();
    let claims = state.runtime.claim_stats().await?;
    Ok(HttpResponse::Ok().json(json!({
        "sessions_live": stats.registry.live,
        "claimed": claims.claimed,
        "oldest_claim_age_ms": claims.oldest_claim_age_ms,
        "active_turns": stats.active,
        "transactions_committed": stats.persistence.transactions,
        "largest_batch": stats.persistence.largest_batch,
        "write_requests": stats.persistence.requests,
        "failed_write_requests": stats.persistence.failed_requests,
        "actors_started": stats.registry.started,
        "actors_replaced": stats.registry.replaced,
        "event_streams": state.runtime.sessions().event_streams(),
    })))
}

/// `GET /sessions/{id}/status`: the session with what its turns are doing: `claimed` (a turn
/// holds the claim) and since when, `running` (a turn is in flight in this process), its
/// newest event's seq, where its log starts (0 unless retention compacted it), and its last
/// turn terminal (an event record, or `null`).
pub(super) async fn status(
    req: HttpRequest,
    state: web::Data<State>,
) -> Result<HttpResponse, ApiError> {
    let id = extract::session_id(&req)?;
    let sessions = state.runtime.sessions();
    let session = sessions.get(&id).await?;
    let last_seq = sessions.last_seq(&id).await?;
    let log_start = sessions.log_start(&id).await?;
    let last_terminal = sessions.last_terminal(&id).await?;
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    Ok(HttpResponse::Ok().json(json!({
        "claimed": session.time_suspended.is_some(),
        "claim_age_ms": session.time_suspended.map(|t| (now - t).max(0)),
        "running": sessions.active().contains(&id),
        "last_seq": last_seq,
        "log_start": log_start,
        "last_terminal": last_terminal,
        "session": session,
    })))
}
