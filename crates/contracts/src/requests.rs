//! Each service's closed set of requests. A service decodes an envelope once into its
//! enum and dispatches on the variant; a message type it does not serve is refused here.

use crate::{Envelope, Named, WireError, payload, v1};

macro_rules! requests {
    ($(#[$meta:meta])* $name:ident for $service:expr => { $($variant:ident($msg:ident)),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug)]
        pub enum $name {
            $($variant(v1::$msg)),+
        }

        impl $name {
            /// The message types this service answers.
            pub const MESSAGE_TYPES: &'static [&'static str] = &[$(<v1::$msg as Named>::NAME),+];

            /// Decodes the envelope's payload into the request it names.
            pub fn decode(env: &Envelope) -> Result<Self, WireError> {
                match env.message_type.as_str() {
                    $(<v1::$msg as Named>::NAME => Ok(Self::$variant(payload(env)?)),)+
                    other => Err(WireError::UnknownRequest { service: $service, got: other.to_owned() }),
                }
            }
        }
    };
}

requests!(
    /// What the drafts service answers.
    DraftsRequest for crate::subjects::DRAFTS => {
        WaitForPosition(WaitForPosition),
        Submit(SubmitDraft),
        ListPending(ListPendingDrafts),
        ListMine(ListMyDrafts),
        Get(GetDraft),
        Withdraw(WithdrawDraft),
    }
);

requests!(
    /// What the approval service answers.
    ApprovalRequest for crate::subjects::APPROVAL => {
        WaitForPosition(WaitForPosition),
        GetKeys(GetApprovalKeys),
        Approve(ApproveDraft),
        Reject(RejectDraft),
    }
);

requests!(
    /// What the runtime registry answers.
    RegistryRequest for crate::subjects::RUNTIME_REGISTRY => {
        WaitForPosition(WaitForPosition),
        Reserve(ReserveBoxType),
        Release(ReleaseReservation),
        AwaitActivation(AwaitActivation),
        List(ListBoxes),
        Get(GetBox),
        Assign(AssignUser),
        Action(BoxAction),
    }
);

requests!(
    /// What the audit service answers.
    AuditRequest for crate::subjects::AUDIT => {
        WaitForPosition(WaitForPosition),
        Query(QueryAudit),
        Verify(VerifyAudit),
    }
);

requests!(
    /// What the provisioner and the gateway answer over NATS: only read-your-writes waits.
    WaitOnlyRequest for "a service without requests of its own" => {
        WaitForPosition(WaitForPosition),
    }
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::envelope;

    #[test]
    fn a_request_decodes_once_into_its_variant_and_foreign_types_are_refused() {
        let env = envelope(&v1::GetDraft { draft_id: "d1".into() }, "c", "", None);
        assert!(matches!(DraftsRequest::decode(&env), Ok(DraftsRequest::Get(g)) if g.draft_id == "d1"));
        assert!(matches!(RegistryRequest::decode(&env), Err(WireError::UnknownRequest { service: "runtime-registry", .. })));
        let garbage = Envelope { message_type: <v1::GetDraft as Named>::NAME.into(), payload: vec![0xff, 0xff], ..Default::default() };
        assert!(matches!(DraftsRequest::decode(&garbage), Err(WireError::Decode { .. })));
    }
}
