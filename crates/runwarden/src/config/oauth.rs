//! `auth = { oauth = { ... } }` of an MCP server: the grant, the client and, for the
//! assertion grants, where the JWT comes from.

use std::path::PathBuf;

use anyhow::{Context, bail};
use runwarden_oauth::{
    AssertionSource, AuthMethod, Grant, IdentityProvider, OAuthSettings, SigningAlg,
};
use runwarden_vault::SecretName;

use super::file::OAuthSection;
use super::load::http_url;

/// `auth = { oauth = { ... } }`, checked at load with the key named.
pub(super) fn oauth_settings(
    mut section: OAuthSection,
    at: &str,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> anyhow::Result<OAuthSettings> {
    let at = format!("{at} auth.oauth");
    let grant = Grant::parse(&section.grant).with_context(|| {
        format!(
            "{at}: unknown grant {:?}: use \"client_credentials\", \"authorization_code\", \"jwt_bearer\" or \"cross_app_access\"",
            section.grant
        )
    })?;
    let (assertion, identity_provider) = assertion_settings(&mut section, grant, &at, resolve)?;
    let mut settings = OAuthSettings::new(grant);
    let secret = |key: &str, name: Option<String>| -> anyhow::Result<Option<SecretName>> {
        name.map(|n| SecretName::new(n).with_context(|| format!("{at}: {key}")))
            .transpose()
    };
    settings.client_secret = secret("client_secret", section.client_secret)?;
    settings.private_key = secret("private_key", section.private_key)?;
    settings.client_id = section.client_id;
    if let Some(method) = &section.auth_method {
        settings.auth_method = Some(AuthMethod::parse(method).with_context(|| {
            format!("{at}: unknown auth_method {method:?}: use client_secret_basic, client_secret_post, private_key_jwt or none")
        })?);
    }
    if let Some(alg) = &section.signing_alg {
        settings.signing_alg = SigningAlg::parse(alg)
            .with_context(|| format!("{at}: unknown signing_alg {alg:?}: use ES256 or RS256"))?;
    }
    match settings.auth_method {
        Some(AuthMethod::PrivateKeyJwt) if settings.private_key.is_none() => {
            bail!("{at}: auth_method \"private_key_jwt\" needs private_key = \"<vault secret>\"")
        }
        Some(AuthMethod::ClientSecretBasic | AuthMethod::ClientSecretPost)
            if settings.client_secret.is_none() =>
        {
            bail!(
                "{at}: auth_method {:?} needs client_secret = \"<vault secret>\"",
                section.auth_method.unwrap_or_default()
            )
        }
        _ => {}
    }
    if grant == Grant::ClientCredentials {
        if settings.client_id.is_none() {
            bail!(
                "{at}: grant \"client_credentials\" needs client_id (and client_secret or private_key)"
            );
        }
        if settings.client_secret.is_none()
            && settings.private_key.is_none()
            && settings.auth_method != Some(AuthMethod::None)
        {
            bail!(
                "{at}: grant \"client_credentials\" needs client_secret or private_key (vault secret names)"
            );
        }
    }
    if let Some(url) = section.client_metadata_url {
        let parsed = url::Url::parse(&url).ok();
        if !parsed.is_some_and(|u| u.scheme() == "https" && u.path() != "/") {
            bail!(
                "{at}: client_metadata_url must be an https URL with a path (the Client ID Metadata Document)"
            );
        }
        settings.client_metadata_url = Some(url);
    }
    if settings.client_id.is_some()
        && settings.client_metadata_url.is_some()
        && grant == Grant::ClientCredentials
    {
        bail!("{at}: client_metadata_url goes with grant \"authorization_code\"");
    }
    if settings.client_metadata_url.is_some() && settings.assertion.is_some() {
        bail!("{at}: client_metadata_url goes with grant \"authorization_code\"");
    }
    settings.scopes = section.scopes;
    settings.dpop = section.dpop;
    if grant == Grant::CrossAppAccess && settings.client_id.is_none() {
        bail!(
            "{at}: grant \"cross_app_access\" needs client_id (the client the ID-JAG is issued to)"
        );
    }
    settings.assertion = assertion;
    settings.identity_provider = identity_provider;
    Ok(settings)
}

/// The keys of the assertion grants: where the JWT comes from (a file or a command) and,
/// for `cross_app_access`, the identity provider. Each key is refused with other grants.
fn assertion_settings(
    section: &mut OAuthSection,
    grant: Grant,
    at: &str,
    resolve: &dyn Fn(PathBuf) -> PathBuf,
) -> anyhow::Result<(Option<AssertionSource>, Option<IdentityProvider>)> {
    let (file_key, command_key, file, command) = match grant {
        Grant::JwtBearer => (
            "assertion_file",
            "assertion_command",
            section.assertion_file.take(),
            section.assertion_command.take(),
        ),
        _ => (
            "id_token_file",
            "id_token_command",
            section.id_token_file.take(),
            section.id_token_command.take(),
        ),
    };
    refuse_stray_assertion_keys(section, grant, at)?;
    if !matches!(grant, Grant::JwtBearer | Grant::CrossAppAccess) {
        if file.is_some() || command.is_some() {
            bail!("{at}: {file_key} and {command_key} go with grant \"cross_app_access\"");
        }
        return Ok((None, None));
    }
    let source = match (file, command) {
        (Some(path), None) => AssertionSource::File(resolve(path)),
        (None, Some(argv)) if argv.first().is_some_and(|p| !p.trim().is_empty()) => {
            AssertionSource::Command(argv)
        }
        (None, Some(_)) => {
            bail!("{at}: {command_key} needs a program: [\"PROGRAM\", \"ARG\", ...]")
        }
        (Some(_), Some(_)) => bail!("{at}: give {file_key} or {command_key}, not both"),
        (None, None) => bail!(
            "{at}: grant \"{}\" needs {file_key} = \"PATH\" or {command_key} = [\"PROGRAM\", ...]",
            grant.as_str()
        ),
    };
    if grant == Grant::JwtBearer {
        return Ok((Some(source), None));
    }
    let (Some(token_endpoint), Some(client_id)) = (
        section.idp_token_endpoint.take(),
        section.idp_client_id.take(),
    ) else {
        bail!(
            "{at}: grant \"cross_app_access\" needs idp_token_endpoint (the identity provider's token endpoint) and idp_client_id"
        );
    };
    http_url(&format!("{at} idp_token_endpoint"), &token_endpoint)?;
    let client_secret = section
        .idp_client_secret
        .take()
        .map(|n| SecretName::new(n).with_context(|| format!("{at}: idp_client_secret")))
        .transpose()?;
    Ok((
        Some(source),
        Some(IdentityProvider {
            token_endpoint,
            client_id,
            client_secret,
        }),
    ))
}

/// Refuses an assertion key set with a grant it does not belong to, naming the grant it
/// goes with. Called after the grant's own keys were taken out of `section`.
fn refuse_stray_assertion_keys(
    section: &OAuthSection,
    grant: Grant,
    at: &str,
) -> anyhow::Result<()> {
    let stray = [
        (
            "assertion_file",
            section.assertion_file.is_some(),
            "jwt_bearer",
        ),
        (
            "assertion_command",
            section.assertion_command.is_some(),
            "jwt_bearer",
        ),
        (
            "id_token_file",
            section.id_token_file.is_some(),
            "cross_app_access",
        ),
        (
            "id_token_command",
            section.id_token_command.is_some(),
            "cross_app_access",
        ),
        (
            "idp_token_endpoint",
            section.idp_token_endpoint.is_some() && grant != Grant::CrossAppAccess,
            "cross_app_access",
        ),
        (
            "idp_client_id",
            section.idp_client_id.is_some() && grant != Grant::CrossAppAccess,
            "cross_app_access",
        ),
        (
            "idp_client_secret",
            section.idp_client_secret.is_some() && grant != Grant::CrossAppAccess,
            "cross_app_access",
        ),
    ];
    if let Some((key, _, owner)) = stray.iter().find(|(_, set, _)| *set) {
        bail!("{at}: {key} goes with grant \"{owner}\"");
    }
    Ok(())
}
