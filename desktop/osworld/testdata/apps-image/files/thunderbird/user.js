// The guest user's Thunderbird profile (legato.default, made the default
// of the Debian install by profiles.ini and installs.ini: FDC34C9F024745EB is
// the hash Thunderbird derives from /usr/lib/thunderbird).
// A POP3 account that never connects (no network in the guest) and the
// Local Folders: with an account Thunderbird opens its main window instead
// of the account setup.
user_pref("mail.accountmanager.accounts", "account1,account2");
user_pref("mail.accountmanager.defaultaccount", "account1");
user_pref("mail.accountmanager.localfoldersserver", "server2");
user_pref("mail.account.account1.server", "server1");
user_pref("mail.account.account1.identities", "id1");
user_pref("mail.account.account2.server", "server2");
user_pref("mail.identity.id1.fullName", "Legato User");
user_pref("mail.identity.id1.useremail", "user@legato.test");
user_pref("mail.identity.id1.valid", true);
user_pref("mail.server.server1.type", "pop3");
user_pref("mail.server.server1.hostname", "127.0.0.1");
user_pref("mail.server.server1.userName", "user");
user_pref("mail.server.server1.name", "user@legato.test");
user_pref("mail.server.server1.login_at_startup", false);
user_pref("mail.server.server1.check_new_mail", false);
user_pref("mail.server.server1.directory-rel", "[ProfD]Mail/127.0.0.1");
user_pref("mail.server.server2.type", "none");
user_pref("mail.server.server2.hostname", "Local Folders");
user_pref("mail.server.server2.userName", "nobody");
user_pref("mail.server.server2.name", "Local Folders");
user_pref("mail.server.server2.directory-rel", "[ProfD]Mail/Local Folders");
// First-run pages, prompts and bars that would greet every attempt.
user_pref("mail.shell.checkDefaultClient", false);
user_pref("mail.rights.override", true);
user_pref("mailnews.start_page.enabled", false);
user_pref("mail.provider.suppress_dialog_on_startup", true);
user_pref("app.donation.eoy.version.viewed", 999);
user_pref("app.update.enabled", false);
user_pref("app.update.auto", false);
user_pref("datareporting.policy.dataSubmissionEnabled", false);
user_pref("datareporting.policy.dataSubmissionPolicyBypassNotification", true);
user_pref("toolkit.telemetry.reportingpolicy.firstRun", false);
user_pref("mail.spotlight.firstRunDone", true);
user_pref("offline.autoDetect", false);
user_pref("extensions.update.enabled", false);
user_pref("browser.aboutConfig.showWarning", false);
