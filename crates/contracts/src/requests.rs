//! Each service's closed set of requests. A service decodes an envelope once into
//! [`Incoming`] (a read-your-writes wait, which every process answers, or one of its own
//! requests) and dispatches on the variant; a message type it does not serve is refused
//! here.

use crate::{Envelope, Named, WireError, payload, v1};

/// What a process is asked: a read-your-writes wait, or one of its own requests `R`.
#[derive(Debug)]
pub enum Incoming<R> {
    Wait(v1::WaitForPosition),
    Request(R),
}

macro_rules! requests {
    ($(#[$meta:meta])* $name:ident for $service:expr => { $($variant:ident($msg:ident)),* $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug)]
        pub enum $name {
            $($variant(v1::$msg)),*
        }

        impl $name {
            /// The message types this service answers besides waits.
            pub const MESSAGE_TYPES: &'static [&'static str] = &[$(<v1::$msg as Named>::NAME),*];

            /// Decodes the envelope's payload into the request it names.
            pub fn decode(env: &Envelope) -> Result<Incoming<Self>, WireError> {
                match env.message_type.as_str() {
                    <v1::WaitForPosition as Named>::NAME => Ok(Incoming::Wait(payload(env)?)),
                    $(<v1::$msg as Named>::NAME => Ok(Incoming::Request(Self::$variant(payload(env)?))),)*
                    other => Err(WireError::UnknownRequest { service: $service, got: other.to_owned() }),
                }
            }
        }
    };
}

requests!(
    /// What the drafts service answers.
    DraftsRequest for crate::subjects::DRAFTS => {
        Submit(SubmitDraft),
        SubmitChange(SubmitChange),
        Revise(ReviseDraft),
        ListPending(ListPendingDrafts),
        ListMine(ListMyDrafts),
        Get(GetDraft),
        Withdraw(WithdrawDraft),
        List(ListDrafts),
        CheckPolicy(CheckPolicy),
    }
);

requests!(
    /// What the approval service answers.
    ApprovalRequest for crate::subjects::APPROVAL => {
        Approve(ApproveDraft),
        Reject(RejectDraft),
        GetPolicy(GetPolicy),
        PublishPolicy(PublishPolicy),
    }
);

requests!(
    /// What the runtime registry answers.
    RegistryRequest for crate::subjects::RUNTIME_REGISTRY => {
        Reserve(ReserveBoxType),
        Release(ReleaseReservation),
        List(ListBoxes),
        Get(GetBox),
        Assign(AssignUser),
        Action(BoxAction),
        Page(ListBoxesPage),
        History(GetBoxHistory),
        Unassign(UnassignUser),
        Feasibility(AssessFeasibility),
        EditManifest(EditBoxManifest),
        EditConfig(EditBoxConfig),
        SyncBundle(SyncBundle),
        CreateWorker(CreateWorker),
        GetWorker(GetWorker),
        ListWorkers(ListBoxWorkers),
        Provenance(GetWorkerProvenance),
        StopWorker(StopWorker),
        PauseWorker(PauseWorker),
        AddInput(AddWorkerInput),
        Heartbeat(HostHeartbeat),
        GetBundle(GetBundle),
        Report(ReportWorker),
        AskTool(AskTool),
        ListToolRequests(ListToolRequests),
        DecideTool(DecideToolRequest),
        GetToolRequest(GetToolRequest),
        PublishEvent(PublishTriggerEvent),
        TriggerTopics(ListTriggerTopics),
    }
);

requests!(
    /// What the audit service answers.
    AuditRequest for crate::subjects::AUDIT => {
        Query(QueryAudit),
        Verify(VerifyAudit),
        Export(ExportAudit),
        RegisterWebhook(RegisterWebhook),
        ListWebhooks(ListWebhooks),
        RemoveWebhook(RemoveWebhook),
        ListWebhookDeliveries(ListWebhookDeliveries),
    }
);

requests!(
    /// What the provisioner (the execution host side) answers.
    ProvisionerRequest for crate::subjects::PROVISIONER => {
        PrepareBinding(PrepareBinding),
        ConsumeBinding(ConsumeBinding),
        ResolveBinding(ResolveBinding),
    }
);

requests!(
    /// The gateway answers nothing over NATS but read-your-writes waits.
    WaitOnly for "a process without requests of its own" => {}
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope;

    #[test]
    fn a_request_decodes_once_into_its_variant_and_foreign_types_are_refused() {
        let env = envelope(&v1::GetDraft { draft_id: "d1".into(), ..Default::default() }, "c", "");
        assert!(matches!(DraftsRequest::decode(&env), Ok(Incoming::Request(DraftsRequest::Get(g))) if g.draft_id == "d1"));
        let wait = envelope(&v1::WaitForPosition { position: 3, ..Default::default() }, "c", "");
        assert!(matches!(WaitOnly::decode(&wait), Ok(Incoming::Wait(w)) if w.position == 3));
        assert!(matches!(WaitOnly::decode(&env), Err(WireError::UnknownRequest { .. })));
        assert!(matches!(RegistryRequest::decode(&env), Err(WireError::UnknownRequest { service: "runtime-registry", .. })));
        let garbage = Envelope { message_type: <v1::GetDraft as Named>::NAME.into(), payload: vec![0xff, 0xff], ..Default::default() };
        assert!(matches!(DraftsRequest::decode(&garbage), Err(WireError::Decode { .. })));
    }
}
