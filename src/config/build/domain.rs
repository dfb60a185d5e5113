//! A domain's descriptors added a top-level descriptor at a time, as a file is read.

use std::sync::Arc;

use super::{add_descriptor, Builder, Ctx, Here, Interned, LevelCtx, Names};
use crate::config::raw::RawDescriptor;
use crate::config::{Config, ConfigError, Domain, Level, LoadOptions};

impl Builder {
    /// Starts `domain`'s descriptors from `file`: a new domain, or one another file began when
    /// `merge_domains` allows it. [`Builder::close_domain`] puts it back.
    pub(in crate::config) fn open_domain(
        &mut self,
        file: &str,
        domain: String,
        opts: LoadOptions,
    ) -> Result<OpenDomain, ConfigError> {
        let ctx = Ctx {
            file,
            domain: &domain,
        };
        if domain.is_empty() {
            return Err(ctx.err("domain", "domain must not be empty"));
        }
        let root = match self.domains.remove(&domain) {
            Some(existing) if opts.merge_domains => existing.root,
            Some(existing) => {
                let first = self.domain_files[&domain].clone();
                self.domains.insert(domain.clone(), existing);
                return Err(ctx.err(
                    "domain",
                    format!("duplicate domain \"{domain}\" (already defined in {first})"),
                ));
            }
            None => Level::default(),
        };
        if self.files.last().is_none_or(|f| **f != *file) {
            self.files.push(file.into());
        }
        Ok(OpenDomain {
            file: file.to_owned(),
            file_no: u32::try_from(self.files.len() - 1).expect("fewer than 2^32 files"),
            names: Names::of(&root),
            root,
            live: self.live.clone(),
            interned: std::mem::take(&mut self.interned),
            domain,
            added: 0,
        })
    }

    pub(in crate::config) fn close_domain(&mut self, open: OpenDomain) {
        let OpenDomain {
            file,
            domain,
            root,
            interned,
            ..
        } = open;
        self.interned = interned;
        self.domain_files.entry(domain.clone()).or_insert(file);
        self.domains
            .insert(domain.clone(), Domain { name: domain, root });
    }
}

/// A domain whose top-level descriptors are being added one at a time, as a file is read.
pub(in crate::config) struct OpenDomain {
    pub(super) file: String,
    /// The file's number in the builder's list.
    pub(super) file_no: u32,
    pub(super) domain: String,
    pub(super) root: Level,
    /// The root level's `key_value` names, for the duplicate check.
    names: Names,
    /// Top-level descriptors this file added so far: the next one's index in its path.
    added: u32,
    /// The config being served, when this one is built to replace it.
    live: Option<Arc<dyn AsRef<Config> + Send + Sync>>,
    /// The builder's, while the domain is open.
    interned: Interned,
}

impl OpenDomain {
    /// The file's next top-level descriptor, built and filed, its parsed form dropped.
    pub(in crate::config) fn add(&mut self, raw: RawDescriptor) -> Result<(), ConfigError> {
        let path = format!("descriptors[{}]", self.added);
        let at = [self.file_no, self.added];
        self.added += 1;
        let ctx = Ctx {
            file: &self.file,
            domain: &self.domain,
        };
        let here = Here {
            path: &path,
            at: &at,
        };
        let served = (self.live.as_deref())
            .and_then(|c| c.as_ref().domain(&self.domain))
            .map(|d| &d.root);
        let mut beside = LevelCtx {
            interned: &mut self.interned,
            served,
            size_as_served: true,
        };
        add_descriptor(
            &ctx,
            &mut self.root,
            &mut self.names,
            raw,
            &here,
            &self.domain,
            &mut beside,
        )
    }
}
